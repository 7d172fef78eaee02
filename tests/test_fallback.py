"""The demo stream with capture switched off (log-only): no edges at all, yet every output
row's backward lineage, asked by its rid as usual, is answered by inference and equals the
brute-force oracle, flagged ``via: inference`` and exact, with the gap it fills named."""

from __future__ import annotations

import random

import pytest

from headwater.adapters.kafka import ensure_topics
from headwater.demo import orders as data
from headwater.demo.run import end_offsets, run_pipeline
from headwater.query.api import LineageClient
from headwater.query.backend import LineageError, UnknownRow

from .conftest import index, own_topics
from .oracle import as_input, demo_lineage

ORDERS = 300


@pytest.fixture(scope="module")
def run(spark, stack_config, tmp_path_factory):
    config, tag = own_topics(stack_config, "fallback")
    config = config.with_overrides(capture="log-only")
    topic = f"orders-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    events = data.order_events(ORDERS, malformed_every=31)
    coordinates = data.produce(config.bootstrap, topic, events)
    sink, _ = run_pipeline(spark, config, tmp_path_factory.mktemp("fallback"), topic,
                           end_offsets(topic, coordinates), say=print, max_per_batch=120)
    index(config)
    rows = spark.read.parquet(sink).select("order_id", "_hw_rid").collect()
    return config, rows, demo_lineage(topic, events, coordinates, data.customers())


def test_every_row_of_an_uncaptured_stream_gets_its_lineage_inferred(run):
    config, rows, expected = run
    assert sorted(r.order_id for r in rows) == sorted(expected)
    with LineageClient(config) as client:
        for row in rows:
            answer = client.backward(row._hw_rid)
            assert {as_input(x) for x in answer} == expected[row.order_id], row.order_id
            assert all(x.via == "inference" and x.exact and x.kind == "source" for x in answer)
            # Not complete: the batch was not captured; the answer names it, and fills it.
            (gap,) = answer.gaps
            assert gap.query == "enriched_orders" and gap.status == "log-only" and not answer.complete
        one = rows[0]
        (customer,) = client.backward(one._hw_rid, to="customers")
        assert customer.dataset == "customers" and customer.key is not None


def test_what_inference_cannot_answer_is_a_clear_error(run):
    config, rows, _ = run
    with LineageClient(config) as client:
        with pytest.raises(LineageError, match="to sources only"):
            client.backward(rows[0]._hw_rid, to="output")
        with pytest.raises(UnknownRow):
            client.backward(random.Random(3).getrandbits(62))
        with pytest.raises(UnknownRow):
            client.forward(rows[0]._hw_rid)  # forward from an uncaptured row: nothing to walk, nothing inferred
