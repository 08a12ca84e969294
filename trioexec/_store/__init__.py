"""Stores: where executions are recorded. `MemoryStore`, `SQLiteStore` and
`PostgresStore` behave the same."""

from .._changes import Change as Change
from ._base import Command as Command
from ._base import Pause as Pause
from ._base import Recovery as Recovery
from ._base import Requeued as Requeued
from ._base import RunRecord as RunRecord
from ._base import RunRecovery as RunRecovery
from ._base import ScheduleRecord as ScheduleRecord
from ._base import Store as Store
from ._open import open_store as open_store
from ._postgres import PostgresStore as PostgresStore
from ._sqlite import MemoryStore as MemoryStore
from ._sqlite import SQLiteStore as SQLiteStore
