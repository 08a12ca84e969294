"""``python -m trioexec.cli``: the ``trioexec`` command (as ``python -m trioexec``)."""

from . import run

run()
