"""The demo stream with capture switched off (log-only): no edges at all, yet every output
row's backward lineage and every input row's forward lineage, asked by its rid as usual, is
answered by inference and equals the brute-force oracle, flagged ``via: inference`` and
exact, with the gap it fills named."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from headwater.adapters.kafka import ensure_topics
from headwater.core.rid import kafka_rid, table_rid, table_row_rid
from headwater.demo import orders as data
from headwater.demo.run import end_offsets, run_pipeline
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError, UnknownRow
from headwater.store.plans import PlanStore
from tests.conftest import index, own_topics, records_read, sink_file_batches
from tests.oracle import as_input, demo_lineage, derived_from, parse

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

ORDERS = 300


def log_only_stream(spark, stack_config, folder, name: str, events: list, partitions: int, max_per_batch: int,
                    keys: dict | None = None):
    """The demo over ``events`` with capture off, indexed: (config, topic, coordinates, sink, query)."""
    config, tag = own_topics(stack_config, name)
    config = config.with_overrides(capture="log-only")
    topic = f"{name}-{tag}"
    ensure_topics(config.bootstrap, [topic], partitions)
    coordinates = data.produce(config.bootstrap, topic, events)
    sink, query = run_pipeline(spark, config, folder, topic, end_offsets(topic, coordinates), say=print,
                               max_per_batch=max_per_batch, keys=keys)
    index(config)
    return config, topic, coordinates, sink, query


@pytest.fixture(scope="module")
def run(spark, stack_config, tmp_path_factory):
    events = data.order_events(ORDERS, malformed_every=31)
    config, topic, coordinates, sink, query = log_only_stream(spark, stack_config, tmp_path_factory.mktemp("fallback"),
                                                              "orders", events, 2, 120)
    rows = spark.read.parquet(sink).select("order_id", "_hw_rid").collect()
    # Each event's record: (topic, partition, offset), the batch that read it, whether it is garbage.
    read = records_read(query)
    records = [((topic, partition, offset), read[topic, partition, offset], parse(value) is None)
               for (_, value), (partition, offset) in zip(events, coordinates)]
    return config, rows, demo_lineage(topic, events, coordinates, data.customers()), records


def test_every_row_of_an_uncaptured_stream_gets_its_lineage_inferred(run):
    config, rows, expected, _ = run
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


def test_every_input_row_of_an_uncaptured_stream_gets_its_forward_lineage_inferred(run):
    config, rows, expected, records = run
    derived = derived_from(expected)
    order_of = {r._hw_rid: r.order_id for r in rows}
    # Asked among them: garbage records and valid ones the stream filtered out, each with an empty answer.
    assert any(garbage for _, _, garbage in records)
    assert any(not garbage and ("kafka", *record) not in derived for record, _, garbage in records)
    with LineageClient(config) as client:
        for record, batch, _ in records:
            answer = client.forward(kafka_rid(*record))
            assert {order_of[x.rid] for x in answer} == derived.get(("kafka", *record), set()), record
            assert all(x.via == "inference" and x.exact and x.kind == "output" and x.dataset == "enriched_orders"
                       and x.batches == [batch] for x in answer), record
            assert [(g.query, g.batch, g.status) for g in answer.gaps] == [("enriched_orders", batch, "log-only")]
            assert not answer.complete
    # Every customers row: read by every batch, so every batch is a gap of its answer. Asked of this
    # stream's own store: the session's graph holds other streams' customers rows, of the same rids.
    batches = sorted({batch for _, batch, _ in records})
    with LineageClient(config, backend="csprov") as client:
        for customer in data.customers():
            key = str(customer["customer_id"])
            answer = client.forward(f"table:customers:{key}")  # the one customers table this store describes
            assert {order_of[x.rid] for x in answer} == derived.get(("table", "customers", key), set()), key
            assert all(x.via == "inference" and x.exact for x in answer)
            assert [g.batch for g in answer.gaps] == batches
        # As from edges: to the query's own rows by name, and attribute level over the sink's columns
        # (order_id, customer_id, name, region, amount_eur, event_time; names and regions from customers).
        record = kafka_rid(*next(r for r, _, _ in records if ("kafka", *r) in derived))
        answer = [x.to_dict() for x in client.forward(record)]
        assert answer and [x.to_dict() for x in client.forward(record, to="enriched_orders")] == answer
        assert [x.to_dict() for x in client.forward(record, cols=0b000001)] == answer
        assert not client.forward(record, cols=0b001100) and all(x["cols"] == 0b110011 for x in answer)


def test_what_inference_cannot_answer_is_a_clear_error(run):
    config, rows, _, records = run
    with LineageClient(config) as client:
        with pytest.raises(LineageError, match="to sources only"):
            client.backward(rows[0]._hw_rid, to="output")
        with pytest.raises(LineageError, match="to their output rows only"):
            client.forward(kafka_rid(*records[0][0]), to="source")
        with pytest.raises(UnknownRow):
            client.backward(random.Random(3).getrandbits(62))
        with pytest.raises(UnknownRow):
            client.forward(random.Random(3).getrandbits(62))  # read by no batch
        with pytest.raises(UnknownRow):
            client.forward(rows[0]._hw_rid)  # a sink row: no query reads the sink, nothing derives from it


@pytest.fixture(scope="module")
def twins(spark, stack_config, tmp_path_factory):
    """A log-only stream of a few orders, one of them sent three times over: three equal output rows."""
    events = data.order_events(12)
    kept = demo_lineage("any", events, [(0, i) for i in range(len(events))], data.customers())  # order_id → lineage
    twin = next(event for event in events if json.loads(event[1])["order_id"] in kept)
    events += [twin, twin]
    config, topic, coordinates, sink, query = log_only_stream(spark, stack_config, tmp_path_factory.mktemp("twins"),
                                                              "twins", events, 1, 100)
    read = records_read(query)
    # Each record, the batch that read it, the order_ids the oracle derives from it (not for the twins:
    # the oracle keeps one record per order_id), and whether it is a twin.
    derived = derived_from(demo_lineage(topic, events, coordinates, data.customers()))
    records = [((topic, p, o), read[topic, p, o], derived.get(("kafka", topic, p, o), set()), event == twin)
               for event, (p, o) in zip(events, coordinates)]
    return config, sink, records, json.loads(twin[1])["order_id"]


def test_equal_output_rows_and_a_changed_sink_are_answered_as_flagged_supersets(twins):
    config, sink, records, twin = twins
    rows = ds.dataset(sink, format="parquet").to_table(columns=["order_id", "_hw_rid"]).to_pylist()
    order_of = {r["_hw_rid"]: r["order_id"] for r in rows}
    twin_rows = {r["_hw_rid"] for r in rows if r["order_id"] == twin}
    assert len(twin_rows) == 3
    with LineageClient(config) as client:
        for record, batch, expected, is_twin in records:
            answer = client.forward(kafka_rid(*record))
            if is_twin:  # which of the three equal rows is this record's, nothing tells: all three, none exact
                assert {x.rid for x in answer} == twin_rows and not any(x.exact for x in answer), record
            else:
                assert {order_of[x.rid] for x in answer} == expected and all(x.exact for x in answer), record
            assert [g.batch for g in answer.gaps] == [batch] and not answer.complete
    # A sink file changed after its batch wrote it: the replay no longer gives the batch's rows,
    # so every row the batch wrote is answered, none of them exact.
    record, batch, _, _ = next(r for r in records if r[2] and not r[3])
    files = sorted(Path(f) for f, b in sink_file_batches(config, "enriched_orders").items() if b == batch)
    changed = next(f for f in files if pq.read_metadata(f).num_rows)
    pq.write_table(pq.read_table(changed).slice(1), changed)
    left = {rid for f in files for rid in pq.read_table(f, columns=["_hw_rid"])["_hw_rid"].to_pylist()}
    with LineageClient(config) as client:
        answer = client.forward(kafka_rid(*record))
    assert {x.rid for x in answer} == left and not any(x.exact for x in answer)
    assert [g.batch for g in answer.gaps] == [batch]


@pytest.fixture(scope="module")
def keyless(spark, stack_config, tmp_path_factory):
    """A log-only stream of a hundred orders whose customers table has no declared key, so that
    capture names its rows by their whole content; and each customers row's rid by customer_id,
    as capture computes it: Spark's ``xxhash64`` of the row's columns."""
    from pyspark.sql import functions as F

    events = data.order_events(100, seed=13)
    workdir = tmp_path_factory.mktemp("keyless")
    config, topic, coordinates, sink, query = log_only_stream(spark, stack_config, workdir, "keyless", events, 2, 40,
                                                              keys={})
    rows = spark.read.parquet(sink).select("order_id", "_hw_rid").collect()
    customers = spark.read.parquet(str(workdir / "customers.parquet"))
    # Capture logs the columns it hashed: the fallback hashes those, whatever the plan reads.
    (source,) = (s for s in PlanStore(config.store_uri(), config.log_topic).latest("enriched_orders")["sources"]
                 if s["source"] == "static")
    assert source["key"] == [] and source["hashed"] == customers.columns
    table = f"file:{workdir / 'customers.parquet'}"  # the table's identity: where it lives
    content = F.xxhash64(F.lit("table"), F.lit(table), *[F.col(c) for c in customers.columns])
    named = dict(customers.select("customer_id", content).collect())
    read = records_read(query)
    return config, rows, demo_lineage(topic, events, coordinates, data.customers()), named, sorted(set(read.values()))


def test_rows_of_a_table_without_a_declared_key_get_captures_rids_by_inference(keyless):
    config, rows, expected, named, batches = keyless
    assert sorted(r.order_id for r in rows) == sorted(expected)
    customer_of = {rid: str(customer_id) for customer_id, rid in named.items()}
    assert len(customer_of) == len(data.customers())
    with LineageClient(config) as client:
        for row in rows:
            answer = client.backward(row._hw_rid)
            found = {("table", "customers", customer_of.get(x.rid, f"rid {x.rid}")) if x.dataset == "customers"
                     else as_input(x) for x in answer}
            assert found == expected[row.order_id], row.order_id
            (customer,) = (x for x in answer if x.dataset == "customers")
            assert customer.key is None and customer.via == "inference" and customer.exact and customer.kind == "source"
    # Forward from each customers row, by the rid capture gives it: the orders joined to it, in every batch.
    derived = derived_from(expected)
    order_of = {r._hw_rid: r.order_id for r in rows}
    with LineageClient(config, backend="csprov") as client:
        for customer_id, rid in named.items():
            answer = client.forward(rid)
            assert {order_of[x.rid] for x in answer} == derived.get(("table", "customers", str(customer_id)), set())
            assert all(x.via == "inference" and x.exact for x in answer)
            assert [g.batch for g in answer.gaps] == batches


def test_a_keyless_table_whose_rids_cannot_be_reproduced_is_a_clear_error(tmp_path):
    import pyarrow as pa

    from headwater.core.config import Config
    from headwater.core.plan import Attr
    from headwater.query.fallback import Fallback
    from headwater.spark.operators import Relation

    pq.write_table(pa.table({"id": [1, 2], "tags": [["a"], []]}), tmp_path / "tagged.parquet")
    location = {"paths": [f"file:{tmp_path / 'tagged.parquet'}"], "format": "parquet"}
    # A logged plan names a nested type by no string (``operators._attr``: "").
    relation = Relation(0, "Relation", [Attr("id", 1, "long"), Attr("tags", 2, "")], location=location)
    fallback = Fallback(Config(store_dir=str(tmp_path / "store")))
    with pytest.raises(LineageError, match="no declared key.*declare keys="):
        fallback.content_rids(relation, "tagged")
    flat = Relation(0, "Relation", [Attr("id", 1, "long")], location=location)
    assert fallback.content_rids(flat, "tagged").tolist() == [table_row_rid("tagged", [i], ["long"]) for i in (1, 2)]


def test_table_rids_name_rows_by_the_declared_key_or_by_the_columns_capture_hashed(tmp_path):
    import pyarrow as pa

    from headwater.core.config import Config
    from headwater.core.plan import Attr
    from headwater.core.rid import KEY_SEPARATOR, table_row_rids
    from headwater.query.fallback import Fallback
    from headwater.spark.operators import Relation

    pq.write_table(pa.table({"id": [1, 2, 3], "name": ["a", "b", None], "w": [1.5, 2.0, -0.0]}), tmp_path / "d.parquet")
    table = f"file:{tmp_path / 'd.parquet'}"  # the table's identity: where it lives, not its name
    location = {"paths": [table], "format": "parquet"}
    relation = Relation(0, "Relation", [Attr("id", 1, "long"), Attr("name", 2, "string"), Attr("w", 3, "double")],
                        location=location)

    def kept(**logged) -> dict:  # the plan's log record, as capture writes it
        return {"sources": [{"source": "static", "location": location, "dataset": f"table:{table}", "table": table,
                             "name": "d", **logged}]}

    fallback = Fallback(Config(store_dir=str(tmp_path / "store")))
    by_id = fallback.table_rids(relation, kept(key=["id"]))
    assert by_id.tolist() == [table_rid(table, str(i)) for i in (1, 2, 3)]
    assert fallback.table_rids(relation, kept(key=["id"]), [2, 0]).tolist() == [by_id[2], by_id[0]]
    assert fallback.table_rids(relation, kept(key=["id", "w"]), [1]).tolist() == \
        [table_rid(table, KEY_SEPARATOR.join(("2", "2.0")))]
    # Without a key: over the columns capture logged as hashed, else over every column read.
    assert fallback.table_rids(relation, kept(hashed=["id", "name"])).tolist() == \
        table_row_rids(table, [[1, 2, 3], ["a", "b", None]], ["long", "string"])
    assert fallback.table_rids(relation, kept(), [2]).tolist() == \
        [table_row_rid(table, [3, None, -0.0], ["long", "string", "double"])]
    with pytest.raises(LineageError, match="did not log as a static table"):
        fallback.table_rids(relation, {"sources": []})
