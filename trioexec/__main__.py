"""``python -m trioexec``: the ``trioexec`` command."""

from .cli import run

run()
