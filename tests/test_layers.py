"""The package's shape, read from its source with `ast` (ARCHITECTURE.md, "Target
layout"; issue 14): imports point down the layers and form no cycle, storage and
values stay below what is built on them, the SQLite and CLI libraries stay in their
modules. No size cap: a module is as long as its concept needs (issue 31: the
700-line cap drew module borders where no concept ended).

Every import counts, at module level or inside a function: a function-level import
still ties the two modules together, it only hides the edge from the import-time
order. Imports under ``if TYPE_CHECKING:`` are exempt: they never run.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import pathlib
import subprocess
import sys

import attrs
import pytest

import trioexec

PACKAGE = pathlib.Path(trioexec.__file__).parent

#: Top to bottom: a module imports from its own layer or those below it, never above.
#: A module in no layer fails `test_every_module_has_a_layer`: place new ones here.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "package, CLI",
        frozenset(
            {
                "trioexec",
                "trioexec.__main__",
                "trioexec.cli*",
                "trioexec._demo",
                "trioexec.contrib*",
                "trioexec.web*",
            }
        ),
    ),
    ("durable", frozenset({"trioexec.durable*"})),
    # The facade is where workflows meet the executor (API.md puts start_workflow
    # on Executor), so it sits above them; the coordinator is built on the parts.
    (
        "executor facade",
        frozenset(
            {
                "trioexec._executor",
                "trioexec._deterministic",
                "trioexec._signals",
                "trioexec._results",
            }
        ),
    ),
    ("workflows", frozenset({"trioexec._coordinator", "trioexec._workflow"})),
    (
        "executor parts",
        frozenset(
            {
                "trioexec._core",
                "trioexec._control",
                "trioexec._admission",
                "trioexec._waits",
                "trioexec._keyshare",
                "trioexec._workers",
                "trioexec._journal",
                "trioexec._dedupe",
                "trioexec._remote",
                "trioexec._recovery",
                "trioexec._shutdown",
                "trioexec._causation",
                "trioexec._schedule",
            }
        ),
    ),
    # The machine: what the executor decides, with no I/O (no Trio, no store).
    ("machine", frozenset({"trioexec._machine*"})),
    (
        "tasks, handle, slots",
        frozenset(
            {
                "trioexec._spec",
                "trioexec._handle",
                "trioexec._poller",
                "trioexec._slots",
                "trioexec._taskref",
                "trioexec._observe",
                "trioexec._backoff",
                "trioexec.testing",
            }
        ),
    ),
    ("store", frozenset({"trioexec._store*"})),
    (
        "values",
        frozenset(
            {
                "trioexec._records",
                "trioexec._errors",
                "trioexec._metrics",
                "trioexec._events",
                "trioexec._durable_records",
                # What the machine and the shell hand the store: the typed changes
                # and the executions' columns they set (issue 31).
                "trioexec._changes",
                "trioexec._columns",
            }
        ),
    ),
)

#: Modules exempt from the per-module checks (layers) while a
#: re-cut is under way. Empty: issue 14's re-cut has landed.
PENDING_RECUT: set[str] = set()

#: Third-party libraries kept to the modules that own them (STYLE.md, "Layout").
LIBRARY_OWNERS = {
    "sqlite3": frozenset({"trioexec._store._sqlite*", "trioexec._store._durable_tables"}),
    "sqlite_utils": frozenset({"trioexec._store._sqlite*"}),
    "click": frozenset({"trioexec.cli*"}),
    "rich": frozenset({"trioexec.cli*"}),
    "starlette": frozenset({"trioexec.web*"}),
    "jinja2": frozenset({"trioexec.web*"}),
    "hypercorn": frozenset({"trioexec.web*"}),
}


def _matches(module: str, patterns: frozenset[str]) -> bool:
    """``module`` is one of ``patterns``; ``x*`` also matches ``x`` and ``x.``/``x_`` names."""
    return any(module == p or (p.endswith("*") and module.startswith(p[:-1])) for p in patterns)


@attrs.frozen
class Import:
    target: str  # the imported module (a trioexec module, or a library's top level)
    line: int


@attrs.frozen
class Module:
    name: str
    path: pathlib.Path
    tree: ast.Module
    imports: tuple[Import, ...]
    every_import: tuple[Import, ...]  #: those under ``if TYPE_CHECKING:`` too


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(
    name: str, is_package: bool, tree: ast.Module, known: set[str], every: bool = False
) -> list[Import]:
    """The imports of module ``name``; with ``every``, those under ``if
    TYPE_CHECKING:`` too."""
    package = name if is_package else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree) if every else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            found.append(Import(source, node.lineno))
            # `from . import x` imports the submodule x when there is one.
            found.extend(
                Import(f"{source}.{alias.name}", node.lineno)
                for alias in node.names
                if f"{source}.{alias.name}" in known
            )
    return sorted((i for i in found if i.target != "__future__"), key=lambda i: i.line)


@functools.cache
def modules() -> dict[str, Module]:
    paths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        paths[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    out = {}
    for name, (path, is_package) in paths.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, str(path))
        out[name] = Module(
            name=name,
            path=path,
            tree=tree,
            imports=tuple(_imports(name, is_package, tree, set(paths))),
            every_import=tuple(_imports(name, is_package, tree, set(paths), every=True)),
        )
    return out


def internal_imports(module: Module) -> list[Import]:
    known = modules()
    return [i for i in module.imports if i.target in known]


def layer_of(name: str) -> int:
    for index, (_, members) in enumerate(LAYERS):
        if _matches(name, members):
            return index
    raise LookupError(name)


def _skip_if_pending(name: str) -> None:
    if name in PENDING_RECUT:
        pytest.skip("issue 14 re-cut in progress")


NAMES = sorted(modules())


# ---------------------------------------------------------------- the scanner itself


def test_the_scanner_finds_relative_absolute_and_function_level_imports_but_not_type_only():
    tree = ast.parse(
        "from __future__ import annotations\n"
        "import json, trioexec._records\n"
        "from typing import TYPE_CHECKING\n"
        "from .. import _errors\n"
        "from ._base import Store\n"
        "if TYPE_CHECKING:\n"
        "    from ..durable import DurableStore\n"
        "else:\n"
        "    import sqlite3\n"
        "def f():\n"
        "    from .._spec import task\n"
    )
    found = _imports("trioexec._store._x", False, tree, {"trioexec._errors"})
    assert [(i.target, i.line) for i in found] == [
        ("json", 2),
        ("trioexec._records", 2),
        ("typing", 3),
        ("trioexec", 4),
        ("trioexec._errors", 4),
        ("trioexec._store._base", 5),
        ("sqlite3", 9),
        ("trioexec._spec", 11),
    ]
    # From a package's __init__, one dot is the package itself.
    found = _imports("trioexec.durable", True, ast.parse("from ._store import X"), set())
    assert [i.target for i in found] == ["trioexec.durable._store"]


def test_the_scan_sees_the_whole_package():
    assert {
        "trioexec",
        "trioexec.cli",
        "trioexec._store._sqlite",
        "trioexec.durable._worker",
    } <= set(NAMES)
    # The CLI package's durable commands import `trioexec.durable` inside functions.
    cli = modules()["trioexec.cli._durable"]
    assert {"click", "trioexec.durable"} <= {i.target for i in cli.imports}


# ---------------------------------------------------------------- imports


def test_every_module_has_a_layer():
    unplaced = []
    for name in NAMES:
        try:
            layer_of(name)
        except LookupError:
            unplaced.append(name)
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


def test_no_import_circle_counting_type_checking_imports():
    """Issue 31: a type-only import still ties two modules together; no circle
    even counting those (a layer hiding an upward call behind TYPE_CHECKING)."""
    known = modules()
    graph = {
        name: {i.target for i in module.every_import if i.target in known} - {name}
        for name, module in known.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(reversed(exc.args[1]))}")


def test_no_import_cycles():
    graph = {
        name: {i.target for i in internal_imports(module)} - {name}
        for name, module in modules().items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(reversed(exc.args[1]))}")


@pytest.mark.parametrize("name", NAMES)
def test_imports_point_down_the_layers(name):
    """Covers, among others: storage never imports `trioexec.durable` or any part of
    the executor; the value modules import only each other; the executor core does
    not import workflows or durable (they are built on it)."""
    _skip_if_pending(name)
    module = modules()[name]
    here = layer_of(name)
    upward = [
        f"line {i.line}: {i.target} ({LAYERS[layer_of(i.target)][0]})"
        for i in internal_imports(module)
        if layer_of(i.target) < here
    ]
    assert not upward, f"{name} ({LAYERS[here][0]}) imports from a layer above it: {upward}"


def test_the_store_and_values_layers_are_what_the_issue_says():
    """The layering rules issue 14 names, spelled out against `LAYERS`, so a change
    to the table cannot quietly loosen them."""
    store, values = layer_of("trioexec._store"), layer_of("trioexec._records")
    assert values == len(LAYERS) - 1
    assert store == values - 1
    for value in ("trioexec._records", "trioexec._errors", "trioexec._metrics", "trioexec._events"):
        assert layer_of(value) == values
    # (and the durable records and states, which errors carry: issue 31, no import circle)
    assert [n for n in NAMES if layer_of(n) == values] == sorted(
        [
            "trioexec._changes",
            "trioexec._columns",
            "trioexec._durable_records",
            "trioexec._errors",
            "trioexec._events",
            "trioexec._metrics",
            "trioexec._records",
        ]
    )
    assert all(n.startswith("trioexec._store") for n in NAMES if layer_of(n) == store)
    # The executor core (its parts) sits below workflows and durable, which are
    # built on it; durable sits above the facade too (it runs an open_executor).
    parts = [n for n in NAMES if LAYERS[layer_of(n)][0] == "executor parts"]
    assert {"trioexec._core", "trioexec._workers", "trioexec._admission"} <= set(parts)
    for core in parts:
        for above in ("trioexec._workflow", "trioexec._coordinator", "trioexec.durable._worker"):
            assert layer_of(above) < layer_of(core), (above, core)
    for facade in ("trioexec._executor", "trioexec._deterministic"):
        assert layer_of("trioexec.durable") < layer_of(facade)


@pytest.mark.parametrize("library", sorted(LIBRARY_OWNERS))
def test_libraries_stay_in_their_modules(library):
    owners = LIBRARY_OWNERS[library]
    users = sorted(
        f"{name} (line {i.line})"
        for name, module in modules().items()
        for i in module.imports
        if i.target.partition(".")[0] == library and not _matches(name, owners)
    )
    assert not users, f"only {sorted(owners)} may import {library}; also: {users}"


def test_every_module_imports_first_in_a_fresh_interpreter():
    """Each module can be the first one imported (a cycle hidden in a function or
    a package ``__init__`` shows up as a partially initialised module). Not
    ``__main__``: importing it runs the command.

    Importing a module imports its packages first: one that a package's own
    import loads (most load with ``trioexec``) is imported exactly as that
    package's turn imported it, which is not done twice (``NAMES`` is sorted:
    a package comes before its modules)."""
    names = [n for n in NAMES if not n.endswith(".__main__")]
    script = (
        "import importlib, sys\n"
        "failed = []\n"
        "loads = {}  # a package: the modules its import (first) loaded\n"
        f"for name in {names!r}:\n"
        "    parts = name.split('.')\n"
        "    above = ['.'.join(parts[:i]) for i in range(1, len(parts))]\n"
        "    if any(name in loads.get(package, ()) for package in above):\n"
        "        continue\n"
        "    for loaded in [m for m in sys.modules if m.partition('.')[0] == 'trioexec']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {exc!r}')\n"
        "    loads[name] = {m for m in sys.modules if m.partition('.')[0] == 'trioexec'}\n"
        "print('\\n'.join(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""


def test_the_durable_tables_import_first_in_a_fresh_interpreter():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import trioexec._store._durable_tables, sys;"
            " print(sorted(m for m in sys.modules if m.startswith('trioexec.durable')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # and it pulled in nothing of trioexec.durable


def test_import_trioexec_loads_no_backend_or_extra(tmp_path):
    """``import trioexec`` pays only for what every user needs: SQLite's
    sqlite_utils (with the click and pluggy it imports) loads when a SQLite file
    is opened, psycopg with a PostgreSQL store, the extras with their commands."""
    heavy = ("sqlite_utils", "click", "pluggy", "psycopg", "psycopg_pool", "rich", "starlette")
    script = (
        "import sys, trioexec\n"
        f"print(sorted(m for m in sys.modules if m.partition('.')[0] in {heavy!r}))\n"
        "trioexec.SQLiteStore(sys.argv[1]).close()\n"
        "print('sqlite_utils' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "t.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]


def test_every_public_error_is_defined_in_errors():
    """One place defines the errors (issue 14): every exception the package
    exports, from ``trioexec`` or ``trioexec.durable``, comes from `_errors`."""
    import trioexec.durable

    exported = [
        getattr(module, name)
        for module in (trioexec, trioexec.durable)
        for name in module.__all__
        if isinstance(getattr(module, name), type)
        and issubclass(getattr(module, name), BaseException)
    ]
    assert {e.__name__ for e in exported} >= {"TrioexecError", "Conflict", "PromiseRejected"}
    assert [e for e in exported if e.__module__ != "trioexec._errors"] == []


def test_the_executions_columns_are_listed_once():
    """Issue 31: the executions' columns are defined in `_columns` alone;
    the schemas, the row layout, PostgreSQL's casts and a new row derive from it.
    No other module holds a literal list of most of them (a second definition)."""
    from trioexec._columns import ROW_COLUMNS

    columns = set(ROW_COLUMNS)
    found = {}
    for name, module in modules().items():
        if name == "trioexec._columns":
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                named = {i.value for i in items if isinstance(i, ast.Constant)} & columns
                if len(named) > 2 * len(columns) // 3:
                    found[f"{name}:{node.lineno}"] = len(named)
    assert not found, f"a second list of the executions' columns: {found}"


# ---------------------------------------------------------------- wiring

#: The executor's parts: an attribute of one of these names on another object is
#: a part, handed over when that object is made, never assigned later.
PARTS = frozenset(
    {
        "control", "events", "gate", "journal", "keyshare", "lifecycle", "nursery",
        "observer", "pending", "recovery", "runs", "shutdown", "slots", "tally", "workers",
    }
)  # fmt: skip


def _methods() -> frozenset[str]:
    """The names of the package's methods (properties aside)."""
    names = set()
    for module in modules().values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                        ast.unparse(d).endswith(("property", "setter")) for d in item.decorator_list
                    ):
                        names.add(item.name)
    return frozenset(names)


def late_links(tree: ast.AST, methods: frozenset[str]) -> list[str]:
    """Assignments that tie one object to another after it was made: a
    callback (a lambda, a partial, a bound method, an ``on_*``) or a part
    (`PARTS`) assigned to an attribute of an object other than ``self``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            assigned = target.elts if isinstance(target, ast.Tuple) else [target]
            for sub in assigned:
                if not isinstance(sub, ast.Attribute):
                    continue
                owner = sub.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue  # (its own attribute)
                callback = (
                    isinstance(value, ast.Lambda)
                    or (
                        isinstance(value, ast.Call)
                        and ast.unparse(value.func) in ("functools.partial", "partial")
                    )
                    or (isinstance(value, ast.Attribute) and value.attr in methods)
                    or (sub.attr.startswith("on_") and not _is_none(value))
                )
                if callback or (sub.attr in PARTS and not _is_none(value)):
                    found.append(f"{ast.unparse(node)[:100]} (line {node.lineno})")
    return found


def _is_none(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def test_the_late_link_scanner_finds_callbacks_and_parts_assigned_later():
    source = """
journal.on_written = self.lifecycle.written
self.lifecycle.wake_worker = pending.on_ready = self.workers.work_arrived
self.keyshare.free_slots = lambda: slots.available
core.lifecycle.runs = self._runs
ex._runs.nursery = nursery
job.on_done = functools.partial(done, 1)
self.steps = steps
self.on_idle = on_idle
job.on_done = None
job.status = status
job.result, outputs[sid] = job.result
"""
    found = late_links(ast.parse(source), frozenset({"written", "work_arrived"}))
    assert [line.rsplit(" (", 1)[1] for line in found] == [
        "line 2)", "line 3)", "line 3)", "line 4)", "line 5)", "line 6)", "line 7)",
    ]  # fmt: skip


def test_no_late_links():
    """Issue 31: the parts are wired through their constructors; none has a
    callback or a part of another assigned to it after it is made."""
    methods = _methods()
    found = {
        name: links
        for name, module in modules().items()
        if (links := late_links(module.tree, methods))
    }
    assert not found, f"late links (hand them to the constructor): {found}"
