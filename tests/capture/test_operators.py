"""Every traced operator pipeline against the brute-force oracle, both directions.

Each pipeline runs traced over a Kafka topic of randomized events in several
micro-batches; its sink rows must equal the oracle's rows (as multisets, so capture
changes no output), and for every output row the backward lineage, and for every
input the forward lineage, must equal the oracle's exactly.
"""

from __future__ import annotations

from collections import Counter

import pytest

from headwater.adapters.spark_lines import recent_progress
from headwater.core.rid import kafka_rid
from headwater.demo.run import end_offsets, run_until
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError
from tests import pipelines
from tests.conftest import index
from tests.oracle import as_input

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

EVENTS = 400


@pytest.fixture(scope="module")
def env(spark, stack_config, tmp_path_factory):
    yield from pipelines.event_env(spark, stack_config, tmp_path_factory.mktemp("ops"), "ops", EVENTS, seed=11)


def content(row: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in row.items()))


@pytest.mark.parametrize("name", pipelines.pipelines_here())
def test_pipeline_lineage_equals_the_oracle(spark, env, name):
    source = (spark.readStream.format("kafka").option("startingOffsets", "earliest")
              .option("kafka.bootstrap.servers", env.config.bootstrap)
              .option("subscribe", env.topic).option("maxOffsetsPerTrigger", 150).load())
    df = pipelines.spark_pipeline(name, source, env)
    sink = str(env.workdir / f"sink-{name}")
    query = (env.tracer.trace(df, name=f"ops-{name}", keys={"dims": "k"}).writeStream.format("parquet")
             .option("checkpointLocation", str(env.workdir / f"cp-{name}"))
             .trigger(processingTime="200 milliseconds").start(sink))
    run_until(query, end_offsets(env.topic, env.coordinates), say=print)
    assert sum(1 for p in recent_progress(query) if p.numInputRows) >= 3
    index(env.config)

    expected = pipelines.oracle(name, env.topic, env.values, env.coordinates, env)
    got = [r.asDict() for r in spark.read.parquet(sink).collect()]
    assert Counter(content({k: v for k, v in r.items() if k != "_hw_rid"}) for r in got) == \
        Counter(content(r) for r, _ in expected), "capture changed the pipeline's output"

    # Backward: per output content, the multiset of lineage sets must match.
    want = Counter((content(r), lin) for r, lin in expected)
    have = Counter()
    outputs_of: dict = {}
    with LineageClient(env.config) as client:
        lineage_of_rid = {}
        for r in got:
            rid = r.pop("_hw_rid")
            if rid not in lineage_of_rid:
                found = client.backward(rid)
                assert all(x.exact for x in found)
                lineage_of_rid[rid] = frozenset(as_input(x) for x in found)
            have[(content(r), lineage_of_rid[rid])] += 1
            for item in lineage_of_rid[rid]:
                outputs_of.setdefault(item, set()).add(rid)
        assert have == want

        # Forward: every Kafka record reaches exactly this sink's outputs whose lineage
        # holds it (other pipelines of this module read the same records).
        for p, o in env.coordinates:
            item = ("kafka", env.topic, p, o)
            try:
                reached = {x.rid for x in client.forward(kafka_rid(env.topic, p, o), to=f"ops-{name}")}
            except LineageError:  # the record reached no sink at all
                reached = set()
            assert reached == outputs_of.get(item, set())
