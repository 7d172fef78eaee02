"""Which files a batch added to a file sink, from its commit log (``headwater.core.sink_log``)."""

from headwater.core.sink_log import batch_files


def log_of(entries: dict[int, list[str]]):
    return lambda batch: entries.get(batch)


def test_a_plain_entry_lists_the_batch_own_files():
    assert batch_files(3, log_of({3: ["b", "a"]}), []) == ["a", "b"]
    assert batch_files(4, log_of({3: ["a"]}), []) is None


def test_a_compaction_less_what_the_entries_since_the_one_before_listed():
    # Compactions every 3rd batch: 2 and 5 compact; batch 5's own files are its entry less 2.compact, 3 and 4.
    entries = {2: ["a", "b", "c"], 3: ["d"], 4: ["e"], 5: ["a", "b", "c", "d", "e", "f", "g"]}
    assert batch_files(5, log_of(entries), [2, 5]) == ["f", "g"]
    first = {0: ["a"], 1: ["b"], 2: ["a", "b", "c"]}
    assert batch_files(2, log_of(first), [2]) == ["c"]


def test_a_compaction_whose_earlier_entries_are_gone_cannot_be_told():
    assert batch_files(5, log_of({2: ["a"], 4: ["b"], 5: ["a", "b", "c"]}), [2, 5]) is None
