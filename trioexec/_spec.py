"""`@task`, `TaskSpec`, and how a function asks for a `TaskHandle`.

There is no global registry: a spec is a value, collected where it is used.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import attrs

from ._backoff import Backoff as Backoff  # re-exported: it was first defined here
from ._errors import TaskDefinitionError
from ._handle import TaskHandle
from ._records import TYPED, check_id, check_number

HANDLE_PARAM_NAMES = ("handle", "task_handle")

if TYPE_CHECKING:
    # PEP 696 defaults (typing has them from 3.13): a bare `TaskSpec` is
    # `TaskSpec[..., Any]`. Type checkers only: at run time they are plain.
    from typing_extensions import ParamSpec
    from typing_extensions import TypeVar as DefaultTypeVar

    P = ParamSpec("P", default=...)
    R_co = DefaultTypeVar("R_co", covariant=True, default=Any)
else:
    from typing import ParamSpec

    P = ParamSpec("P")
    R_co = TypeVar("R_co", covariant=True)
P2 = ParamSpec("P2")
R = TypeVar("R")


def _annotation_is_handle(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        # A string annotation: the name, qualified or not, maybe quoted (no unions).
        name = annotation.strip().strip("'\"")
        return name == "TaskHandle" or name.endswith(".TaskHandle")
    return annotation is TaskHandle


def _find_handle_param(fn: Callable[..., Any]) -> tuple[str | None, int | None]:
    """The handle parameter's name and, if it can also be given positionally,
    its position (so a caller who passes that argument gets no handle injected)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return None, None
    # A partial's keywords are the caller's own arguments: never overwritten.
    bound = fn.keywords if isinstance(fn, functools.partial) else {}
    found = None
    for param in sig.parameters.values():
        if param.name in bound:
            continue
        if param.name in HANDLE_PARAM_NAMES or _annotation_is_handle(param.annotation):
            found = param
            break
    if found is None:
        return None, None
    if found.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
        raise TaskDefinitionError(
            f"{_describe(fn)}: handle parameter {found.name!r} must accept a keyword "
            "(the executor passes the handle as handle=...)"
        )
    if found.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return found.name, None
    return found.name, list(sig.parameters).index(found.name)


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - we want the method itself
    return call is not None and inspect.iscoroutinefunction(call)


def _describe(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def task_name(fn: Callable[..., Any]) -> str:
    """The name a task of ``fn`` runs under by default: a spec's id, else the
    function's ``__qualname__`` (through partials), else its type's name."""
    if isinstance(fn, TaskSpec):
        return fn.id
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)


@attrs.frozen
class CallInfo:
    """What the executor needs to know to call a function: is it async, and
    under which keyword does it take a handle (None: it takes none)."""

    is_async: bool
    handle_param: str | None
    #: the handle parameter's position when it can be passed positionally: a call
    #: with more arguments than that supplies it itself, and gets no handle
    handle_position: int | None = None

    def for_args(self, args: tuple[Any, ...]) -> CallInfo:
        """This info for a call with ``args``: without the handle if they supply it."""
        position = self.handle_position
        if position is not None and len(args) > position:
            return CallInfo(self.is_async, None)
        return self


_info_cache: weakref.WeakKeyDictionary[Callable[..., Any], CallInfo] = weakref.WeakKeyDictionary()


def call_info(fn: Callable[..., Any]) -> CallInfo:
    """Inspect ``fn`` once (cached per function object) for async-ness and a handle
    parameter. Works on undecorated functions, partials, bound methods and specs."""
    if isinstance(fn, TaskSpec):
        return fn._info
    key: Callable[..., Any] = getattr(fn, "__func__", fn)  # bound methods are made afresh
    try:
        return _info_cache[key]
    except (KeyError, TypeError):
        pass
    info = CallInfo(_is_async_callable(fn), *_find_handle_param(fn))
    # A bound method's signature only drops `self`, so the answer for the
    # underlying function holds for every method bound from it.
    with contextlib.suppress(TypeError):  # not weak-referenceable: just don't cache
        _info_cache[key] = info
    return info


@attrs.frozen(kw_only=True)
class TaskSpec(Generic[P, R_co]):
    """A task declaration made by `task`: the function and its options.

    Still directly callable: ``await spec(context)`` calls the function. Generic
    like the function it wraps: ``@task`` on ``async def f(url: str) -> bytes``
    makes a ``TaskSpec[[str], Coroutine[Any, Any, bytes]]``, which
    ``ex.submit``/``ex.run`` accept wherever they accept ``f``.
    """

    fn: Callable[P, R_co]
    id: str
    dependencies: tuple[str, ...] = ()
    retries: int = 0
    backoff: Backoff = attrs.field(factory=Backoff)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    timeout: float | None = None
    budget: float | None = None
    #: the admission key of its tasks: a str, or a callable of the task's arguments
    key: str | Callable[..., str] | None = None
    priority: int = 0
    #: keep its tasks' values in the store (None: as the executor does)
    keep_result: bool | None = None
    _info: CallInfo = attrs.field(alias="_info")

    @property
    def requires_handle(self) -> bool:
        """True when the function takes a `TaskHandle` (parameter named ``handle``
        or ``task_handle``, or annotated ``TaskHandle``)."""
        return self._info.handle_param is not None

    @property
    def handle_param(self) -> str | None:
        """The keyword the handle is passed as, or None."""
        return self._info.handle_param

    @property
    def is_async(self) -> bool:
        """True for ``async def`` functions; plain functions run in a worker thread."""
        return self._info.is_async

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<TaskSpec {self.id!r}>"


#: priorities are stored as 64-bit integers
_PRIORITY_BOUND = 2**62


def check_priority(priority: object) -> int:
    """A priority: an int (not a bool) below 2**62 in magnitude; else TypeError or ValueError."""
    bound = _PRIORITY_BOUND
    if type(priority) is int and -bound < priority < bound:
        return priority  # (the common case, without a call: it is on the submit path)
    must = "between -2**62 and 2**62"
    return check_number(
        "priority", priority, int, must, typed="an int", gt=-bound, lt=bound, errors=TYPED
    )


def spec_key(spec: TaskSpec, args: tuple[Any, ...]) -> str:
    """The key of a task of ``spec`` called with ``args``: its ``key``, or what its
    key function returns for them. Raises ValueError naming the spec if the
    function raised or returned something that is not a str."""
    key = spec.key
    if callable(key):
        try:
            key = key(*args)
        except Exception as exc:
            raise ValueError(f"{spec.id}: its key function raised {exc!r}") from exc
    if not isinstance(key, str):
        raise ValueError(f"{spec.id}: a key must be a str, got {key!r}")
    return key


def _make_spec(fn: Callable[P2, R], options: dict[str, Any]) -> TaskSpec[P2, R]:
    what: object = fn  # (checked: the caller's type checker may not have been run)
    if isinstance(what, TaskSpec):
        raise TaskDefinitionError(f"{what.id!r} is already a TaskSpec; decorate the function once")
    if not callable(what):
        raise TaskDefinitionError(f"@task needs a callable, got {what!r}")
    task_id = _describe(fn) if options["id"] is None else options["id"]
    if not isinstance(task_id, str) or not task_id:
        raise TaskDefinitionError(f"task id must be a non-empty string, got {task_id!r}")
    try:
        check_id("task id", task_id)  # it is stored as the execution's name
    except ValueError as exc:
        raise TaskDefinitionError(str(exc)) from None

    deps = options["dependencies"]
    if isinstance(deps, str) or not isinstance(deps, Iterable):
        raise TaskDefinitionError(
            f"{task_id}: dependencies must be a list of task ids, got {deps!r}"
        )
    deps = tuple(deps)
    for dep in deps:
        if not isinstance(dep, str) or not dep:
            raise TaskDefinitionError(f"{task_id}: dependency ids must be strings, got {dep!r}")
    if task_id in deps:
        raise TaskDefinitionError(f"{task_id}: a task cannot depend on itself")
    if len(set(deps)) != len(deps):
        raise TaskDefinitionError(f"{task_id}: duplicate dependency in {list(deps)!r}")

    bad = (TaskDefinitionError, TaskDefinitionError)
    retries = options["retries"]
    check_number(f"{task_id}: retries", retries, int, "an int >= 0", ge=0, errors=bad)

    backoff = options["backoff"]
    if backoff is None:
        backoff = Backoff()
    elif not isinstance(backoff, Backoff):
        raise TaskDefinitionError(f"{task_id}: backoff must be a Backoff, got {backoff!r}")

    retry_on = options["retry_on"]
    if isinstance(retry_on, type):
        retry_on = (retry_on,)
    if not isinstance(retry_on, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
    ):
        raise TaskDefinitionError(
            f"{task_id}: retry_on must be an exception class or a tuple of them, got {retry_on!r}"
        )

    for name in ("timeout", "budget"):
        if options[name] is not None:
            what, must = f"{task_id}: {name}", "a finite number > 0"
            check_number(
                what, options[name], float, must, typed="a number", gt=0, lt=math.inf, errors=bad
            )

    key = options["key"]
    try:
        if key is not None and not callable(key):
            check_id("key", key)
        priority = check_priority(options["priority"])
    except (TypeError, ValueError) as exc:
        raise TaskDefinitionError(f"{task_id}: {exc}") from None

    keep_result = options["keep_result"]
    if keep_result is not None and type(keep_result) is not bool:
        raise TaskDefinitionError(f"{task_id}: keep_result must be a bool, got {keep_result!r}")

    assert callable(fn)
    return TaskSpec(
        fn=fn,
        id=task_id,
        dependencies=deps,
        retries=retries,
        backoff=backoff,
        retry_on=retry_on,
        timeout=options["timeout"],
        budget=options["budget"],
        key=key,
        priority=priority,
        keep_result=keep_result,
        _info=CallInfo(_is_async_callable(fn), *_find_handle_param(fn)),
    )


class TaskDecorator(Protocol):
    """What ``@task(...)`` with options returns: a decorator keeping the function's type."""

    def __call__(self, fn: Callable[P2, R], /) -> TaskSpec[P2, R]: ...


@overload
def task(fn: Callable[P2, R], /) -> TaskSpec[P2, R]: ...
@overload
def task(
    fn: None = None,
    /,
    *,
    id: str | None = None,
    dependencies: Iterable[str] = (),
    retries: int = 0,
    backoff: Backoff | None = None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    timeout: float | None = None,
    budget: float | None = None,
    key: str | Callable[..., str] | None = None,
    priority: int = 0,
    keep_result: bool | None = None,
) -> TaskDecorator: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    id: str | None = None,
    dependencies: Iterable[str] = (),
    retries: int = 0,
    backoff: Backoff | None = None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    timeout: float | None = None,
    budget: float | None = None,
    key: str | Callable[..., str] | None = None,
    priority: int = 0,
    keep_result: bool | None = None,
    **unknown: object,
) -> TaskSpec | TaskDecorator:
    """Declare a task. Use bare (``@task``) or with options (``@task(id=..., retries=3)``).

    Args:
      id: the task's id (default: the function's ``__qualname__``).
      dependencies: ids of tasks this one runs after, in a `Workflow`.
      retries: re-runs allowed after the first attempt fails.
      backoff: delays between attempts (`Backoff`); no slot is held while waiting.
      retry_on: which exceptions retry; `PermanentError` and cancellation never do.
      timeout: hard per-attempt limit in seconds, deferred time included.
      budget: cooperative limit on active (slot-holding) seconds; exceeding it is
        recorded, not enforced.
      key: the admission key of its tasks (`KeyLimit`): a str, or a callable
        given the task's arguments that returns one (``submit(key=...)``
        overrides it).
      priority: its tasks' priority (higher starts first; ``submit(priority=...)``
        overrides it).
      keep_result: keep its tasks' values in the store as JSON
        (`ExecutionRecord.result`, `trioexec.wait_result`); None: as the
        executor's ``keep_results`` says (``submit(keep_result=...)`` overrides it).

    Returns a frozen `TaskSpec`, still callable like the function (and typed like
    it). Unknown options are an error at decoration time (and for a type checker).

    Raises:
      TaskDefinitionError: at decoration time, for a non-callable, a bad option
        value or an unknown option.
    """
    options: dict[str, Any] = dict(locals())  # the options, in the signature's order
    del options["fn"], options["unknown"]
    if unknown:
        names = ", ".join(sorted(unknown))
        raise TaskDefinitionError(f"unknown @task option(s): {names} (known: {', '.join(options)})")
    if fn is not None:
        return _make_spec(fn, options)

    def decorate(f: Callable[P2, R], /) -> TaskSpec[P2, R]:
        return _make_spec(f, options)

    return decorate


def collect_specs(items: Iterable[object]) -> dict[str, TaskSpec]:
    """Index the specs of ``tasks=`` by id. Raises TaskDefinitionError for a
    duplicate id (naming it) or an item that is not a `TaskSpec`."""
    specs: dict[str, TaskSpec] = {}
    for item in items:
        if not isinstance(item, TaskSpec):
            raise TaskDefinitionError(f"tasks= takes TaskSpecs made with @task, got {item!r}")
        if item.id in specs:
            raise TaskDefinitionError(f"duplicate task id {item.id!r} in tasks=")
        specs[item.id] = item
    return specs
