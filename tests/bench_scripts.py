"""Load a script of benchmarks/ as a module, for the tests of the benchmarks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/NAME.py as the module ``bench_NAME`` (its directory on sys.path:
    peers.py imports suite.py beside it)."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, f"bench_{name}", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module
