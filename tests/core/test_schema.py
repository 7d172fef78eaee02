import pyarrow as pa
import pytest

from headwater.core.schema import (
    EDGE_SCHEMA,
    LOG_BATCH,
    NODE_SCHEMA,
    PayloadError,
    decode_lineage,
    decode_log,
    encode_lineage,
    encode_log,
)


def tables():
    nodes = pa.Table.from_pylist(
        [{"rid": 1, "kind": "source", "dataset": "kafka:o", "topic": "o", "partition": 0, "offset": 5},
         {"rid": 2, "kind": "output", "dataset": "sink", "query": "q", "batch": 3}], schema=NODE_SCHEMA)
    edges = pa.Table.from_pylist(
        [{"src": 1, "dst": 2, "query": "q", "batch": 3, "op": 0, "exact": True, "cols": -1}], schema=EDGE_SCHEMA)
    return nodes, edges


def test_lineage_payload_round_trips():
    nodes, edges = tables()
    got_nodes, got_edges = decode_lineage(encode_lineage(nodes, edges))
    assert got_nodes.equals(nodes) and got_edges.equals(edges)


@pytest.mark.parametrize("mangle", [
    lambda b: b"XXX" + b[3:],            # bad magic
    lambda b: b[:3] + b"\x09" + b[4:],   # unknown version
    lambda b: b[: len(b) // 2],          # truncated
    lambda b: b[:8] + b"\x00" * 40,      # garbage where the tables should be
    lambda b: b"",
])
def test_damaged_payloads_are_rejected_with_a_reason(mangle):
    nodes, edges = tables()
    with pytest.raises(PayloadError):
        decode_lineage(mangle(encode_lineage(nodes, edges)))


def test_nulls_in_required_columns_are_rejected():
    nodes, edges = tables()
    columns = [pa.array([None], pa.int64()), *edges.columns[1:]]
    bad = pa.table(columns, schema=EDGE_SCHEMA)  # Arrow does not enforce non-null on its own
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, EDGE_SCHEMA) as w:
        w.write_table(bad)
    good = encode_lineage(nodes, edges)
    nodes_len = int.from_bytes(good[4:8], "big")
    with pytest.raises(PayloadError, match="nulls"):
        decode_lineage(good[: 8 + nodes_len] + sink.getvalue().to_pybytes())


def test_edges_between_rows_the_payload_does_not_describe_are_rejected():
    nodes, edges = tables()
    stray = pa.Table.from_pylist(
        [{"src": 1, "dst": 99, "query": "q", "batch": 3, "op": 0, "exact": True, "cols": -1}], schema=EDGE_SCHEMA)
    with pytest.raises(PayloadError, match="dst rids name no row.*99"):
        decode_lineage(encode_lineage(nodes, pa.concat_tables([edges, stray])))


def test_log_records_round_trip_and_reject_unknown():
    record = decode_log(encode_log(LOG_BATCH, query="q", batch=1, status="full"))
    assert record["batch"] == 1 and record["status"] == "full"
    for bad in (b"{}", b"[1]", b"\xff", b'{"schema": "other/1"}'):
        with pytest.raises(PayloadError):
            decode_log(bad)


def test_payloads_concatenated_keep_each_row_and_edge_once():
    from headwater.core.schema import concat_lineage

    nodes, edges = tables()
    more_nodes = pa.Table.from_pylist([{"rid": 3, "kind": "output", "dataset": "sink", "query": "q", "batch": 4}],
                                      schema=NODE_SCHEMA)
    more_edges = pa.Table.from_pylist(
        [{"src": 1, "dst": 3, "query": "q", "batch": 4, "op": 0, "exact": True, "cols": -1}], schema=EDGE_SCHEMA)
    got_nodes, got_edges = concat_lineage([(nodes, edges), (nodes, edges), (more_nodes, more_edges)])
    assert got_nodes["rid"].to_pylist() == [1, 2, 3]
    assert sorted(zip(got_edges["src"].to_pylist(), got_edges["dst"].to_pylist())) == [(1, 2), (1, 3)]
    assert got_edges.schema == EDGE_SCHEMA
    assert concat_lineage([])[1].num_rows == 0
    # The same two rows joined by another batch's edge: a second edge, kept.
    again = pa.Table.from_pylist([{**more_edges.to_pylist()[0], "batch": 5}], schema=EDGE_SCHEMA)
    _, got_edges = concat_lineage([(nodes, edges), (more_nodes, more_edges), (more_nodes, again)])
    assert sorted(zip(got_edges["src"].to_pylist(), got_edges["dst"].to_pylist(), got_edges["batch"].to_pylist())) \
        == [(1, 2, 3), (1, 3, 4), (1, 3, 5)]
