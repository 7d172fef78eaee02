"""When ``headwater narrow --follow`` reads a black-box batch back (``follow.read_back_due``); the follower itself
runs against the stack in tests/query/test_black_box_narrowing.py and bench/black_box_narrowing.py."""

from headwater.query.narrow.follow import EMPTY_WAIT_S, next_floor, read_back_due


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


def test_the_floor_rises_over_done_batches_and_stops_at_the_first_open_or_missing_one():
    done = {0, 1, 2, 4, 5}.__contains__
    assert next_floor([0, 1, 2, 3, 4, 5], None, done) == 3  # 3 waits
    assert next_floor([0, 1, 2, 4, 5], None, done) == 3  # 3 not logged yet: its record may come later
    assert next_floor([4, 5], 3, done) == 3
    assert next_floor([4, 5], None, done) == 6  # a query first seen at batch 4 (its checkpoint's)
    assert next_floor([], 7, done) == 7 and next_floor([], None, done) is None
