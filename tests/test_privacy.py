"""Private names stay in the module that defines them (issue 14), read from the
package's source with `ast`.

A module may use ``obj._name`` (one leading underscore or a mangled ``__name``; not
a dunder) when ``_name`` is its own: assigned as ``self._name``/``cls._name``,
listed in ``__slots__``, a ``def``/``class`` of that name, a module- or class-level
name (class attributes, attrs fields), or a parameter of one of its functions.
Using a private name the module does not define is a *reach* across modules:

- ``x._name`` (read, written or deleted) on anything but ``self``/``cls``;
- ``getattr(x, "_name")`` and its kin (``setattr``, ``hasattr``, ``delattr``);
- ``f(_name=...)``: a private keyword parameter of a function defined elsewhere;
- ``from .mod import _name``: always a reach, the name is another module's
  (importing a private *submodule*, ``from . import _errors``, is not).

The match is by name: a module that defines ``_name`` itself may use it on any
object. Only the package is scanned, not the tests.

A few reaches are a deliberate package-internal interface of a *public* class,
which cannot give those members public names without showing them to its users.
They are listed in `ALLOWED` with the reason; the reaches found must be exactly
those, so a new one fails here, and so does an entry the code no longer needs.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import attrs

import trioexec

PACKAGE = pathlib.Path(trioexec.__file__).parent

#: The reaches the package makes on purpose: (module, private name) -> why.
ALLOWED: dict[tuple[str, str], str] = {
    # TaskHandle (public) is made by the executor's workers, which hand it their
    # observer interface and the Job it runs; users build one with (slot, task_id) only.
    ("trioexec._workers", "_observer"): "TaskHandle(..., _observer=): the workers observe it",
    ("trioexec._workers", "_job"): "TaskHandle(..., _job=): the Job the handle reports on",
    ("trioexec._workers", "_in_thread"): "TaskHandle(..., _in_thread=): a sync task's handle",
    # TaskHandle's executor-side interface: what the executor does to a running
    # task's handle, which a task itself must not call.
    ("trioexec._machine._lifecycle", "_request_cancel"): (
        "TaskHandle._request_cancel: ref.cancel() or a lost lease fires handle.cancelled()"
        " and stops a reclaim in progress"
    ),
    ("trioexec._workers", "_end_attempt"): (
        "TaskHandle._end_attempt: a sync task's attempt ended (its thread may be abandoned);"
        " a defer_until_sync still waiting in that thread stops"
    ),
    ("trioexec._workers", "_close_deferral"): (
        "TaskHandle._close_deferral: a task ends while deferred, without taking a slot"
        " back; its deferred-time clock stops"
    ),
    # The executors (public) tell observers what their tasks do, for
    # trioexec.contrib; a public method would show users an internal interface.
    ("trioexec._observe", "_core"): (
        "_observe.lifecycle_of(ex) and owner_of(ex): contrib's one way into an executor"
    ),
    # Context (public) checks every value written to it is JSON.
    ("trioexec._coordinator", "_trusted"): (
        "Context._trusted: a step's input was just decoded from JSON; the coordinator"
        " wraps it without checking every value again"
    ),
}

_SELF = frozenset({"self", "cls"})
_ATTR_FUNCTIONS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    """``_x`` or ``__x``; not a dunder, not ``_`` alone."""
    return (
        name.startswith("_")
        and name.strip("_") != ""
        and not (name.startswith("__") and name.endswith("__"))
    )


def _private_string(node: ast.AST) -> str | None:
    """The private name a string literal spells (``getattr(x, "_y")``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
        return node.value
    return None


def _on_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in _SELF


@attrs.frozen
class Reach:
    module: str
    name: str
    line: int
    how: str  # "attribute", "getattr", "keyword" or "import"

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.name} ({self.how})"


def _scope_names(body: list[ast.stmt], found: set[str]) -> None:
    """Private names a module or class body binds: defs, classes, assignments
    (attrs fields and class attributes included), ``__slots__`` entries; into
    if/try/with/loop blocks, not into functions."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            if _private(stmt.name):
                found.add(stmt.name)
            continue
        if isinstance(stmt, ast.ClassDef):
            if _private(stmt.name):
                found.add(stmt.name)
            _scope_names(stmt.body, found)
            continue
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            targets = [stmt.target]
        for target in targets:
            found.update(
                n.id for n in ast.walk(target) if isinstance(n, ast.Name) and _private(n.id)
            )
            if isinstance(target, ast.Name) and target.id == "__slots__" and stmt.value:
                found.update(n for n in map(_private_string, ast.walk(stmt.value)) if n)
        for field in ("body", "orelse", "finalbody", "handlers"):
            for part in getattr(stmt, field, None) or ():
                _scope_names(part.body if isinstance(part, ast.ExceptHandler) else [part], found)


def defined(tree: ast.Module) -> set[str]:
    """The private names ``tree`` defines itself."""
    found: set[str] = set()
    _scope_names(tree.body, found)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if _on_self(node.value) and _private(node.attr):
                found.add(node.attr)  # self._x = ..., with ... as self._x, ...
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            found.update(p.arg for p in params if p is not None and _private(p.arg))
        elif (
            # object.__setattr__(self, "_x", value) in a frozen class
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__setattr__"
            and len(node.args) >= 2
            and _on_self(node.args[0])
            and (name := _private_string(node.args[1]))
        ):
            found.add(name)
    return found


def used(tree: ast.Module, submodules: frozenset[str] = frozenset()) -> list[tuple[str, int, str]]:
    """Every use of a private name on something other than ``self``/``cls``, as
    (name, line, how). ``submodules``: names a ``from ... import`` may take that
    are the importing package's private submodules, not attributes."""
    out: list[tuple[str, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _private(node.attr) and not _on_self(node.value):
                out.append((node.attr, node.lineno, "attribute"))
        elif isinstance(node, ast.Call):
            args = node.args
            if (
                isinstance(node.func, ast.Name)
                and node.func.id in _ATTR_FUNCTIONS
                and len(args) >= 2
                and not _on_self(args[0])
                and (name := _private_string(args[1]))
            ):
                out.append((name, node.lineno, "getattr"))
            out.extend(
                (k.arg, node.lineno, "keyword")
                for k in node.keywords
                if k.arg is not None and _private(k.arg)
            )
        elif isinstance(node, ast.ImportFrom):
            out.extend(
                (alias.name, node.lineno, "import")
                for alias in node.names
                if _private(alias.name) and alias.name not in submodules
            )
    return sorted(out, key=lambda u: (u[1], u[0]))


def reaches_in(
    module: str, tree: ast.Module, submodules: frozenset[str] = frozenset()
) -> list[Reach]:
    """The uses in ``tree`` of private names it does not define (imports always)."""
    own = defined(tree)
    return [
        Reach(module, name, line, how)
        for name, line, how in used(tree, submodules)
        if how == "import" or name not in own
    ]


@functools.cache
def package_reaches(root: pathlib.Path = PACKAGE) -> tuple[Reach, ...]:
    """Every reach in the package at ``root`` (module names as in `test_layers`)."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    # `from . import _x` / `from .._store import _sqlite` may name a submodule of
    # any package here: such names are modules, not another module's privates.
    submodules = frozenset(m.rpartition(".")[2] for m in files if "." in m)
    found: list[Reach] = []
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found.extend(reaches_in(name, tree, submodules))
    return tuple(found)


# ---------------------------------------------------------------- the scanner itself


def test_the_scanner_finds_reaches_and_ignores_own_names_self_and_cls():
    tree = ast.parse(
        "import attrs\n"
        "from . import _errors\n"
        "from ._x import _helper, public\n"
        "_LIMIT = 3\n"
        "class A:\n"
        "    __slots__ = ('_slot',)\n"
        "    _level = 1\n"
        "    def __init__(self, other, *, _quiet=False):\n"
        "        self._mine = other._secret\n"  # line 9: a reach
        "        self._slot = cls._anything\n"
        "    def _method(self, other: A):\n"
        "        return other._mine, other._slot, other._level, other._method()\n"
        "@attrs.define\n"
        "class B:\n"
        "    _field: int = 0\n"
        "def f(a, b):\n"
        "    a._field = _LIMIT\n"
        "    b._theirs = a.__class__, a._\n"  # line 18: a reach (assigned, not on self)
        "    A(a, _quiet=True)\n"
        "    return getattr(a, '_hidden'), B(_other=1), super()._base()\n"  # line 20
    )
    assert {"_LIMIT", "_slot", "_level", "_mine", "_method", "_field", "_quiet"} <= defined(tree)
    found = reaches_in("m", tree, frozenset({"_errors"}))
    assert [(r.name, r.line, r.how) for r in found] == [
        ("_helper", 3, "import"),
        ("_secret", 9, "attribute"),
        ("_theirs", 18, "attribute"),
        ("_base", 20, "attribute"),
        ("_hidden", 20, "getattr"),
        ("_other", 20, "keyword"),
    ]


def test_the_scan_sees_the_whole_package():
    modules = {r.module for r in package_reaches()}
    assert {"trioexec._workers", "trioexec._machine._lifecycle"} <= modules
    handle = ast.parse((PACKAGE / "_handle.py").read_text(encoding="utf-8"))
    assert {"_request_cancel", "_attempt_over", "_job", "_Waiter"} <= defined(handle)
    spec = ast.parse((PACKAGE / "_spec.py").read_text(encoding="utf-8"))
    assert "_info" in defined(spec)  # an attrs field


# ---------------------------------------------------------------- the package


def test_private_names_are_not_reached_across_modules():
    found = package_reaches()
    keys = {(r.module, r.name) for r in found}
    new = [str(r) for r in found if (r.module, r.name) not in ALLOWED]
    stale = sorted(set(ALLOWED) - keys)
    problems = []
    if new:
        problems.append(
            "these modules use private names that another module defines: "
            f"{new}. Give the name a public one where it is defined (a private module's "
            "names are already package-internal), or move the code that needs it "
            "there. Only a public class's deliberate package-internal interface "
            "belongs in ALLOWED, with the reason."
        )
    if stale:
        problems.append(f"ALLOWED lists reaches the package no longer makes: remove {stale}")
    assert not problems, "\n".join(problems)


def test_every_allowed_reach_has_a_reason():
    assert all(reason.strip() for reason in ALLOWED.values())
