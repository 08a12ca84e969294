"""Stores: where executions are recorded. `MemoryStore` and `SQLiteStore` behave the same."""

from ._base import Change as Change
from ._base import Recovery as Recovery
from ._base import RunRecord as RunRecord
from ._base import RunRecovery as RunRecovery
from ._base import Store as Store
from ._memory import MemoryStore as MemoryStore
from ._sqlite import SQLiteStore as SQLiteStore
