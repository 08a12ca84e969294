from __future__ import annotations

import functools
import math
import random

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import trioexec
from trioexec import Backoff, TaskDefinitionError, TaskHandle, TaskSpec, task
from trioexec._spec import call_info


def test_bare_decorator_uses_qualname_and_stays_callable():
    @task
    def add(a, b):
        return a + b

    assert isinstance(add, TaskSpec)
    assert add.id == "test_bare_decorator_uses_qualname_and_stays_callable.<locals>.add"
    assert add(2, 3) == 5
    assert add.dependencies == ()
    assert not add.requires_handle
    assert not add.is_async


async def test_called_decorator_with_options():
    backoff = Backoff(initial=1.0, factor=2.0, max=60.0, jitter=0.1)

    @task(id="wait_for_data", dependencies=["fetch"], retries=3, backoff=backoff)
    async def wait_for_data(context, handle):
        return context["x"]

    assert wait_for_data.id == "wait_for_data"
    assert wait_for_data.dependencies == ("fetch",)
    assert wait_for_data.retries == 3
    assert wait_for_data.backoff is backoff
    assert wait_for_data.requires_handle
    assert wait_for_data.handle_param == "handle"
    assert wait_for_data.is_async
    assert await wait_for_data({"x": 1}, None) == 1


def test_spec_is_frozen():
    @task
    def f():
        pass

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        f.id = "other"  # type: ignore[misc]


def test_empty_parentheses_form():
    @task()
    def f():
        return 1

    assert f.id.endswith("f")
    assert f() == 1


@pytest.mark.parametrize(
    "fn_src",
    [
        "async def f(context, handle): pass",
        "async def f(context, task_handle): pass",
        "async def f(context, *, handle): pass",
        "async def f(context, h: TaskHandle): pass",
        "async def f(context, h: 'TaskHandle'): pass",
        "async def f(context, h: 'trioexec.TaskHandle'): pass",
        "def f(context, handle=None): pass",
    ],
)
def test_handle_detection(fn_src):
    ns = {"TaskHandle": TaskHandle, "trioexec": trioexec}
    exec(fn_src, ns)
    spec = task(ns["f"])
    assert spec.requires_handle
    assert call_info(ns["f"]).handle_param == spec.handle_param


def test_string_annotations_from_future_import():
    # This module uses `from __future__ import annotations`: the annotation is a string.
    async def f(context, h: TaskHandle):
        pass

    assert task(f).handle_param == "h"


@pytest.mark.parametrize(
    "fn_src",
    [
        "async def f(context): pass",
        "async def f(handler, handles): pass",
        "def f(*args, **kwargs): pass",
    ],
)
def test_no_handle(fn_src):
    ns: dict = {}
    exec(fn_src, ns)
    assert not task(ns["f"]).requires_handle


def test_positional_only_handle_is_a_definition_error():
    ns: dict = {}
    exec("async def f(handle, /): pass", ns)
    with pytest.raises(TaskDefinitionError, match="handle"):
        task(ns["f"])


def test_detection_on_undecorated_callables():
    class Worker:
        async def run(self, x, task_handle):
            pass

        def sync(self, x):
            pass

    async def plain(handle):
        pass

    w = Worker()
    assert call_info(w.run) == call_info(Worker().run)
    assert call_info(w.run).handle_param == "task_handle"
    assert call_info(w.run).is_async
    assert call_info(w.sync).handle_param is None
    assert not call_info(w.sync).is_async
    assert call_info(functools.partial(plain)).is_async
    assert call_info(functools.partial(plain)).handle_param == "handle"


def test_async_callable_object_is_async():
    class C:
        async def __call__(self):
            pass

    assert call_info(C()).is_async


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": 1.5}, "retries"),
        ({"retries": True}, "retries"),
        ({"dependencies": "fetch"}, "dependencies"),
        ({"dependencies": [1]}, "dependency"),
        ({"dependencies": ["a", "a"]}, "duplicate"),
        ({"id": ""}, "id"),
        ({"id": 3}, "id"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"budget": float("nan")}, "budget"),
        ({"backoff": 1.0}, "backoff"),
        ({"retry_on": "ValueError"}, "retry_on"),
        ({"retry_on": (ValueError, int)}, "retry_on"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options_fail_at_decoration(kwargs, match):
    with pytest.raises(TaskDefinitionError, match=match):

        @task(**kwargs)
        def f():
            pass


def test_self_dependency_is_rejected():
    with pytest.raises(TaskDefinitionError, match="itself"):
        task(id="a", dependencies=["a"])(lambda: None)


def test_non_callable_is_rejected():
    with pytest.raises(TaskDefinitionError, match="42"):
        task(42)  # type: ignore[call-overload]


def test_double_decoration_is_rejected():
    spec = task(lambda: None)
    with pytest.raises(TaskDefinitionError, match="already"):
        task(spec)


def test_retry_on_single_class_is_normalised():
    spec = task(retry_on=KeyError)(lambda: None)
    assert spec.retry_on == (KeyError,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial": 0}, "initial"),
        ({"factor": 0.5}, "factor"),
        ({"initial": 2, "max": 1}, "max"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"initial": "1"}, "initial"),
    ],
)
def test_backoff_validation(kwargs, match):
    with pytest.raises(TaskDefinitionError, match=match):
        Backoff(**kwargs)


def test_backoff_formula_exact():
    b = Backoff(initial=1.0, factor=2.0, max=60.0)
    assert [b.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert b.delay(10_000) == 60  # no overflow


@given(
    initial=st.floats(0.001, 100),
    factor=st.floats(1, 10),
    extra=st.floats(0, 1000),
    jitter=st.floats(0, 0.99),
    n=st.integers(1, 200),
    seed=st.integers(0, 2**32),
)
def test_backoff_jitter_bounds(initial, factor, extra, jitter, n, seed):
    b = Backoff(initial=initial, factor=factor, max=initial + extra, jitter=jitter)
    exponent = (n - 1) * math.log(factor)
    grown_past_max = math.log(initial) + exponent >= math.log(b.max)
    base = b.max if grown_past_max else initial * math.exp(exponent)
    assert b.base_delay(n) == pytest.approx(base, rel=1e-9)
    d = b.delay(n, random.Random(seed))
    assert base * (1 - jitter) * (1 - 1e-9) <= d <= base * (1 + jitter) * (1 + 1e-9)
