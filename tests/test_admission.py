import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioexec import Overflow
from trioexec._machine._admit import Admit, admit, rejection_reason

counts = st.integers(0, 50)


@given(pending=counts, active=counts, deferred=counts, capacity=st.integers(1, 100))
def test_accepts_exactly_below_capacity(pending, active, deferred, capacity):
    for policy in Overflow:
        for can_wait in (True, False):
            d = admit(
                pending=pending,
                active=active,
                deferred=deferred,
                capacity=capacity,
                policy=policy,
                can_wait=can_wait,
            )
            assert (d is Admit.ACCEPT) == (pending + active + deferred < capacity)


@pytest.mark.parametrize(
    ("policy", "can_wait", "pending", "expected"),
    [
        (Overflow.BLOCK, True, 1, Admit.WAIT),
        (Overflow.BLOCK, False, 1, Admit.REJECT),
        (Overflow.REJECT, True, 1, Admit.REJECT),
        (Overflow.FAIL_FAST, True, 1, Admit.FAIL),
        (Overflow.DROP_NEWEST, True, 1, Admit.DROP_NEW),
        (Overflow.DROP_OLDEST, True, 1, Admit.DROP_OLDEST),
        (Overflow.DROP_OLDEST, True, 0, Admit.REJECT),
    ],
)
def test_full_decisions(policy, can_wait, pending, expected):
    d = admit(
        pending=pending,
        active=4 - pending,
        deferred=0,
        capacity=4,
        policy=policy,
        can_wait=can_wait,
    )
    assert d is expected


def test_deferred_count_against_capacity():
    full = admit(pending=0, active=0, deferred=5, capacity=5, policy=Overflow.REJECT)
    assert full is Admit.REJECT


def test_reasons():
    assert rejection_reason(Admit.FAIL, Overflow.FAIL_FAST) == "capacity_exceeded"
    assert rejection_reason(Admit.REJECT, Overflow.REJECT) == "queue_full"
    assert rejection_reason(Admit.REJECT, Overflow.DROP_OLDEST) == "nothing_to_drop"
