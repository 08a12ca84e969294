"""The files here are type-checked by ``tests/test_typing.py`` (mypy --strict),
never run: pytest must not collect them."""

collect_ignore_glob = ["*.py"]
