"""Sphinx configuration for the trioexec documentation.

Build with ``nox -s docs`` or::

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import enum
import inspect
import os
import pathlib
import sys
from typing import Any

# Import the package from this checkout even when it is not installed.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import trioexec

project = "trioexec"
author = "trioexec developers"
copyright = "trioexec developers"
release = trioexec.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxcontrib_trio",
]

# Intersphinx needs the network to fetch objects.inv, and a failed fetch is a
# warning, which -W turns into a failed build. So it is off unless asked for:
#   TRIOEXEC_DOCS_INTERSPHINX=1 sphinx-build ...
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "trio": ("https://trio.readthedocs.io/en/stable/", None),
}
if os.environ.get("TRIOEXEC_DOCS_INTERSPHINX") == "1":
    extensions.append("sphinx.ext.intersphinx")

# `Name` in docstrings is a cross-reference, as in Trio's own docs.
default_role = "py:obj"
# Names from trio and the standard library do not resolve without intersphinx;
# leave them as plain text instead of warning.
nitpicky = False

# Google style docstrings (see STYLE.md).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
templates_path: list[str] = []
exclude_patterns = ["_build"]

html_theme = "furo"
html_title = f"trioexec {release}"


# Classes users get from trioexec but never construct: show no constructor.
_NO_CONSTRUCTOR = {"trioexec.Executor", "trioexec.TaskRef", "trioexec.TaskSpec"}


def _clean_signature(
    app: Any,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str | None] | None:
    """Keep internals out of rendered signatures.

    Hides the constructor of classes users never build and of enums, drops
    parameters whose name starts with an underscore, and drops the
    ``AsyncIterator[...]`` return annotation of ``@asynccontextmanager``
    functions (sphinxcontrib-trio already shows them as ``async with``).
    """
    if what == "class" and (
        name in _NO_CONSTRUCTOR or (isinstance(obj, type) and issubclass(obj, enum.Enum))
    ):
        return "", None
    if what == "function" and inspect.isasyncgenfunction(getattr(obj, "__wrapped__", None)):
        return signature or "", None
    if signature:
        target = obj.__init__ if what == "class" else obj
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return None
        params = list(sig.parameters.values())
        if what == "class" and params and params[0].name == "self":
            params = params[1:]
        public = [p for p in params if not p.name.startswith("_")]
        if len(public) != len(params):
            from sphinx.util.inspect import stringify_signature

            text = stringify_signature(sig.replace(parameters=public), show_return_annotation=False)
            return text, return_annotation
    return None


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _clean_signature)
