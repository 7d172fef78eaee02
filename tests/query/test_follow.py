"""When ``headwater narrow --follow`` reads a black-box batch back (``follow.read_back_due``); the follower itself
runs against the stack in tests/query/test_black_box_narrowing.py and bench/black_box_narrowing.py."""

from headwater.query.narrow.follow import EMPTY_WAIT_S, read_back_due


def test_a_batch_is_not_read_back_again_before_the_store_holds_the_rows_a_read_back_found():
    assert not read_back_due(0, 1_000_000, 0.0, settle=False)
    assert not read_back_due(999_999, 1_000_000, EMPTY_WAIT_S * 10, settle=True)
    assert read_back_due(1_000_000, 1_000_000, 0.0, settle=False)


def test_a_batch_with_no_row_recorded_entering_its_box_waits_unless_settled_now():
    assert not read_back_due(0, None, 0.0, settle=False)
    assert not read_back_due(0, None, EMPTY_WAIT_S - 1, settle=False)
    assert read_back_due(0, None, EMPTY_WAIT_S, settle=False)  # none may enter it: read back to know
    assert read_back_due(0, None, 0.0, settle=True)  # --once: now
    assert read_back_due(1, None, 0.0, settle=False)
