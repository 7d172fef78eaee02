"""Black boxes' narrowed lineage kept in the store (``store/narrowed.py``), locally and in S3: a batch's
narrowing read back as written, its lookups against brute force, and the claims that keep narrowers from
running a batch twice."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from headwater.core.config import Config
from headwater.query.narrow.narrower import Narrowing, NarrowStore
from headwater.store.narrowed import CLAIM_SLACK_S, NarrowedFiles


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.stack)])
def where(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3").uri(tmp_path.name)


def narrowing(seed: int = 1, outs: int = 3000, sources: int = 2000) -> Narrowing:
    """Output rows each from a random set of source rows, some sets shared by several outputs."""
    rng = np.random.default_rng(seed)
    sets = [np.unique(rng.integers(0, sources, rng.integers(1, 5))) + 10**12 for _ in range(outs // 3)]
    out_set = rng.integers(0, len(sets), outs)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sets])])
    return Narrowing("q/1", 7, 42, "grouped", True, "", rng.integers(-(1 << 62), 1 << 62, outs), out_set, offsets,
                     np.concatenate(sets), mask=5, seconds=1.5, steps={"rerun": 1.0}, verified="coded runs")


def test_a_narrowing_reads_back_as_written_and_its_lookups_are_brute_force_s(where):
    store = NarrowStore(Config(store_dir=where, log_topic="t.log"))
    written = narrowing()
    assert store.get("q/1", 7, 42) is None
    store.put(written)
    read = NarrowStore(Config(store_dir=where, log_topic="t.log")).get("q/1", 7, 42)
    assert read.summary() == written.summary()
    for name in ("outs", "out_set", "set_offsets", "members"):
        assert np.array_equal(getattr(read, name), getattr(written, name)), name
    members = [set(written.members[a:b].tolist()) for a, b in zip(written.set_offsets, written.set_offsets[1:])]
    into = {}
    for out, k in zip(written.outs.tolist(), written.out_set.tolist()):
        into.setdefault(out, set()).update(members[k])
    for out in written.outs[:200].tolist():
        assert read.into(out) == sorted(into[out])
    out_of: dict[int, set] = {}
    for out, sources in into.items():
        for source in sources:
            out_of.setdefault(source, set()).add(out)
    for source in list(out_of)[:200]:
        assert read.out_of(source) == sorted(out_of[source])
    assert read.into(12345) == [] and read.out_of(12345) == []
    assert [n.batch for n in store.of_box("q/1", 7)] == [42]
    store.remove("q/1")
    assert store.get("q/1", 7, 42) is None


def test_a_batch_is_claimed_by_one_narrower_until_released_or_its_claim_is_stale(where):
    one, other = NarrowedFiles(where, "t.log"), NarrowedFiles(where, "t.log")
    assert one.claim("q", 1, 2, limit_s=60)
    assert not other.claim("q", 1, 2, limit_s=60) and other.claimed("q", 1, 2)
    one.release("q", 1, 2)
    assert not other.claimed("q", 1, 2) and other.claim("q", 1, 2, limit_s=0)
    if one.local:  # a claim left by a narrower that died, older than its limit: taken over
        path = other._path("q", 1, 2, ".claim")
        past = time.time() - CLAIM_SLACK_S - 5
        os.utime(path, (past, past))
        assert not one.claimed("q", 1, 2) and one.claim("q", 1, 2, limit_s=60)
