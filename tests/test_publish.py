"""Publishing in the sink's write tasks (``publish_through``), outside Spark: rows pass on
unchanged, every edge of the rows (or of the sample) is published, failures never stop rows.

No broker answers here (a free port), so payloads land in the spill, where they are read
back and compared with the edges the rows imply. The Spark path is checked end to end
(``test_end_to_end.py``, ``test_budget.py``).
"""

import pyarrow as pa

from headwater.capture.delivery import DeliverySettings, Spill
from headwater.capture.lineage import BatchContext, SourceEdges
from headwater.capture.publish import STATS, PublishTarget, publish_through, sampled
from headwater.core.schema import decode_lineage
from headwater.deploy.stack import free_port


class Sum:
    """Collects what tasks add, as Spark's accumulator would."""

    def __init__(self):
        self.value = [0] * (len(STATS) + 2)

    def add(self, more):
        self.value = [a + b for a, b in zip(self.value, more)]


def batch(start: int, n: int) -> pa.RecordBatch:
    src = pa.array([{"rid": 1000 + i, "topic": "orders", "partition": 0, "offset": i}
                    for i in range(start, start + n)])
    return pa.RecordBatch.from_pydict({"_hw_c0": [f"row-{i}" for i in range(start, start + n)],
                                       "_hw_rid": list(range(start * 7919, (start + n) * 7919, 7919)),
                                       "_hw_src_3": src})


def run(tmp_path, batches, fraction=None, sources=None):
    settings = DeliverySettings(f"127.0.0.1:{free_port()}", str(tmp_path), send_timeout_s=1.0)
    ctx = BatchContext("q", "sink", 4, 0, sources or (SourceEdges("_hw_src_3", "kafka", None, 1),))
    counts = Sum()
    out = list(publish_through(iter(batches), ctx, PublishTarget(settings, "edges"), ["_hw_c0", "_hw_rid"],
                               fraction, counts))
    spill = Spill(tmp_path, 1 << 30)
    edges = set()
    for path in spill.files():
        claimed, topic, _, value = spill.claim(path)
        claimed.unlink()  # read: else this process's drain thread for the absent broker retries it for good
        assert topic == "edges"
        edges |= {(e["src"], e["dst"]) for e in decode_lineage(value)[1].to_pylist()}
    return out, edges, dict(zip([*STATS, "task_ms", "failed"], counts.value))


def test_rows_pass_on_and_every_edge_is_published(tmp_path):
    batches = [batch(0, 5), batch(5, 3)]
    out, edges, counts = run(tmp_path, batches)
    assert [b.schema.names for b in out] == [["_hw_c0", "_hw_rid"]] * 2
    assert pa.Table.from_batches(out).column("_hw_c0").to_pylist() == [f"row-{i}" for i in range(8)]
    assert edges == {(1000 + i, i * 7919) for i in range(8)}
    assert counts["rows"] == 8 and counts["edges"] == 8 and counts["spilled_edges"] == 8 and counts["failed"] == 0


def test_a_sample_publishes_exactly_the_sampled_rows(tmp_path):
    rows = batch(0, 400)
    _, edges, counts = run(tmp_path, [rows], fraction=0.3)
    chosen = sampled(rows.column("_hw_rid").to_numpy(), 0.3)
    assert edges == {(1000 + i, i * 7919) for i in range(400) if chosen[i]}
    assert 0 < len(edges) < 400 and counts["rows"] == 400


def test_a_lineage_failure_is_counted_and_the_rows_still_pass(tmp_path):
    broken = (SourceEdges("_hw_src_missing", "kafka", None, 1),)
    out, edges, counts = run(tmp_path, [batch(0, 5)], sources=broken)
    assert sum(b.num_rows for b in out) == 5 and edges == set() and counts["failed"] == 1
