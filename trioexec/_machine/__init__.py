"""The machine: what an executor decides, with no I/O (no Trio, no store).

Its methods are synchronous: they read the clock they are given and tell the
parts they were given (typed here by what is asked of them) what the shell
(`trioexec._core` and its parts, `trioexec._waits`) is to carry out in Trio.
tests/test_machine.py drives it without Trio, against a model; docs/design.rst
lists its parts.
"""
