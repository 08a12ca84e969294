"""Names kept when a clearer one came (issue 34): the old name is the same object."""

import trioexec


def test_execution_status_is_run_progress() -> None:
    assert trioexec.ExecutionStatus is trioexec.RunProgress
    assert {"RunProgress", "ExecutionStatus"} <= set(trioexec.__all__)
    assert trioexec.RunProgress("complete") is trioexec.ExecutionStatus.COMPLETE
