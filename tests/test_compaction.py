"""Compaction's connected components on Spark (large-star / small-star) against the numpy ones."""

from __future__ import annotations

import numpy as np
import pytest

from headwater.indexer.sets import components

from .test_sets import random_lineage


@pytest.mark.spark
def test_spark_components_equal_numpy_components(spark):
    from headwater.indexer.compaction import components as spark_components

    for seed in range(3):
        src, dst, _ = random_lineage(seed)
        rng = np.random.default_rng(seed)
        chain = rng.integers(-(1 << 62), 1 << 62, 40)  # a long path, the worst case for rounds
        src = np.concatenate([src, chain[:-1]])
        dst = np.concatenate([dst, chain[1:]])
        df = spark.createDataFrame([(int(a), int(b)) for a, b in zip(src, dst)], "src long, dst long")
        got = {r.rid: r.component for r in spark_components(df).collect()}
        rids, labels = components(src, dst)
        assert got == dict(zip(rids.tolist(), labels.tolist()))
