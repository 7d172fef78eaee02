"""The rows that entered a black box in a batch, read back from the log: what its function re-runs on.

The batch's plan (the optimized one capture logged) is run, below the black box only, over the rows the
batch read (``fallback.Fallback``: Kafka records of its offsets, static tables from their files), carrying
each row's sources (``infer/run.py``). The rows come out as an Arrow table of the black box's child's
columns, typed as Spark typed them, and each with the rids capture gave its sources.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from headwater.core import rid as rids
from headwater.spark.operators import Relation, Unknown

from ..errors import LineageError
from ..infer.evaluate import NotEvaluable
from ..infer.run import LINEAGE, Running


def _ir_node(ir: dict, node_id: int) -> dict | None:
    stack = [ir]
    while stack:
        node = stack.pop()
        if node.get("id") == node_id:
            return node
        stack.extend(node.get("children", []))
    return None


def box_inputs(fallback, box, batch: int) -> tuple[pa.Table, list[list[int]]]:
    """(the rows entering ``box`` in ``batch``, each row's source rids)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_json_value

    plan, kept = fallback.plan(box.query, batch)
    node = _ir_node(kept.get("ir") or {}, box.op)
    if node is None or not node.get("children"):
        raise LineageError(f"the plan log holds no plan node {box.op} of {box.query!r} with an input")
    outputs = [a[1] for a in node["output"]]
    target = next((o for o in plan.operators() if isinstance(o, Unknown) and [a.expr_id for a in o.output] == outputs),
                  None)
    if target is None or len(target.children) != 1:
        raise LineageError(f"the black box {box.dataset} is not found in the optimized plan")
    child = [a[1] for a in node["children"][0]["output"]]
    entry = fallback.entry(box.query, batch)
    tables, read = fallback.tables(entry, kept)
    try:
        frame = Running(plan, tables, lineage=True).run(target.children[0])
    except NotEvaluable as exc:
        raise LineageError(f"the plan below the black box cannot be run here: {exc}") from None
    missing = [c for c in child if c not in frame.columns]
    if missing:
        raise LineageError(f"the plan below the black box does not give its input columns {missing}")
    input_type = _parse_datatype_json_value(box.record["function"]["input"])
    if not isinstance(input_type, StructType):
        raise LineageError(f"the black box's logged input type is {input_type.simpleString()}, not a struct")
    schema = to_arrow_schema(input_type)
    columns = []
    for expr_id, f in zip(child, schema):
        try:
            columns.append(pa.array(frame[expr_id].tolist(), type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise LineageError(f"the black box's input column {f.name} does not read back as {f.type}: {exc}") \
                from None
    table = pa.Table.from_arrays(columns, schema=pa.schema([pa.field(f"c{i}", f.type) for i, f in enumerate(schema)]))
    table = table.rename_columns([f.name for f in schema])
    return table, _source_rids(fallback, plan, kept, read, list(frame[LINEAGE]))


def _source_rids(fallback, plan, kept, read, lineages: list) -> list[list[int]]:
    """Each row's sources, ``(relation id, position)`` pairs, as the rids capture gave them."""
    relations = {op.id: op for op in plan.operators() if isinstance(op, Relation)}
    wanted: dict[int, set[int]] = {}
    for sources in lineages:
        for relation_id, position in sources:
            wanted.setdefault(relation_id, set()).add(position)
    named: dict[tuple[int, int], int] = {}
    for relation_id, seen in wanted.items():
        frame, (kind, _, _) = read[relation_id]
        positions = sorted(seen)
        if kind == "kafka":
            rows = frame.iloc[positions]
            at = np.asarray(positions)
            topics, partitions = rows["topic"].to_numpy(), rows["partition"].to_numpy()
            offsets = rows["offset"].to_numpy(dtype=np.int64)
            for t, p in set(zip(topics.tolist(), partitions.tolist())):
                mine = (topics == t) & (partitions == p)
                found = rids.kafka_rids(t, int(p), offsets[mine])
                named.update(zip([(relation_id, position) for position in at[mine].tolist()], found.tolist()))
        else:
            found = fallback.table_rids(relations[relation_id], kept, positions)
            named.update(((relation_id, position), int(r)) for position, r in zip(positions, found))
    return [sorted({named[s] for s in sources}) for sources in lineages]
