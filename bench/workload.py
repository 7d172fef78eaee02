"""Lineage of a realistic shape, as capture publishes it: for the indexer's bench and tests.

Two queries over one orders topic, batch after batch:

- ``enrich`` (the demo's shape): each order joined with one row of a static
  ``customers`` table (1,000 keys, so every customer row is a hub), one output row per
  order: two edges per output;
- ``totals``: the same orders aggregated per region and window: each output row has a
  fan-in of 1 to 1,000 orders (heavy-tailed), the orders the last ``enrich`` message
  read first, so the two queries' lineage meets in shared source rows.

``lineage_messages`` yields ``(nodes, edges)`` per message, the tables
``schema.encode_lineage`` takes, each message one batch's lineage of one query; rids
are random 64-bit integers, as hashed rids are.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA

CUSTOMERS = 1000
MAX_FAN_IN = 1000


def _nodes(rid, kind: str, dataset: str, **values) -> pa.Table:
    n = len(rid)
    columns = {"rid": pa.array(rid, pa.int64()), "kind": pa.array([kind] * n), "dataset": pa.array([dataset] * n),
               **{k: pa.array(v) for k, v in values.items()}}
    return pa.table([columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
                     for f in NODE_SCHEMA], schema=NODE_SCHEMA)


def _edges(src, dst, query: str, batch: int, op: int, cols: int) -> pa.Table:
    n = len(src)
    return pa.table([pa.array(src, pa.int64()), pa.array(dst, pa.int64()), pa.array([query] * n),
                     pa.array(np.full(n, batch), pa.int64()), pa.array(np.full(n, op, np.int32)),
                     pa.array(np.ones(n, bool)), pa.array(np.full(n, cols), pa.int64())], schema=EDGE_SCHEMA)


def fan_ins(rng: np.random.Generator, n: int) -> np.ndarray:
    """Heavy-tailed fan-in of aggregate rows: mostly small, up to ``MAX_FAN_IN``."""
    return np.minimum(MAX_FAN_IN, np.floor(rng.pareto(0.8, n) + 1)).astype(np.int64)


def lineage_messages(edges: int, seed: int = 0, edges_per_message: int = 5000,
                     prefix: str = "") -> Iterator[tuple[pa.Table, pa.Table]]:
    """Messages of lineage until ``edges`` edges are out (the last message may end short).

    ``prefix`` starts the queries' (and sinks') names, to tell one run's lineage from another's.
    """
    rng = np.random.default_rng(seed)
    customers = rng.integers(-(1 << 62), 1 << 62, CUSTOMERS)
    offset = 0
    batch = 0
    left = edges
    recent = (np.empty(0, np.int64), np.empty(0, np.int64))  # the last enrich message's orders: rids, offsets
    while left > 0:
        enrich = batch % 2 == 0
        query = f"{prefix}enrich" if enrich else f"{prefix}totals"
        if enrich:
            orders = max(1, min(edges_per_message, left) // 2)
            fan = np.ones(orders, dtype=np.int64)
        else:
            cap = min(edges_per_message, left)
            fan = fan_ins(rng, max(1, edges_per_message // 20))
            fan = fan[np.cumsum(fan) <= cap]
            if not len(fan):
                fan = np.array([min(cap, MAX_FAN_IN)])
            orders = int(fan.sum())
        reused = 0 if enrich else min(orders, len(recent[0]))
        fresh = orders - reused
        order_rid = np.concatenate([recent[0][:reused], rng.integers(-(1 << 62), 1 << 62, fresh)])
        order_offset = np.concatenate([recent[1][:reused], np.arange(offset, offset + fresh)])
        offset += fresh
        if enrich:
            recent = (order_rid, order_offset)
        order_nodes = _nodes(order_rid, "source", "kafka:orders", topic=["orders"] * orders,
                             partition=np.zeros(orders, np.int32), offset=order_offset)
        out = rng.integers(-(1 << 62), 1 << 62, len(fan))
        out_nodes = _nodes(out, "output", query, query=[query] * len(fan), batch=np.full(len(fan), batch))
        dst = np.repeat(out, fan)
        parts = [_edges(order_rid, dst, query, batch, 3, 0b111)]
        nodes = [out_nodes, order_nodes]
        if enrich:
            which = rng.integers(0, CUSTOMERS, orders)
            used = np.unique(which)
            nodes.append(_nodes(customers[used], "source", "customers", key=[f"c{i}" for i in used.tolist()]))
            parts.append(_edges(customers[which], out, query, batch, 5, 0b11000))
        message_edges = pa.concat_tables(parts)
        yield pa.concat_tables(nodes), message_edges
        left -= message_edges.num_rows
        batch += 1


def chain_messages(chains: int, hops: int, seed: int = 0) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Lineage through ``hops`` queries in a row, one message per hop: ``chains`` Kafka records, each the start
    of a path of ``hops`` edges (query ``hop<h>`` reads hop ``h - 1``'s output rows). Each path is a component
    as long as it is deep: the shape whose rounds grow with depth (a component's diameter)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(-(1 << 62), 1 << 62, chains)
    read = _nodes(rows, "source", "kafka:orders", topic=["orders"] * chains,
                  partition=np.zeros(chains, np.int32), offset=np.arange(chains))
    for hop in range(1, hops + 1):
        query = f"hop{hop}"
        out = rng.integers(-(1 << 62), 1 << 62, chains)
        written = _nodes(out, "output", query, query=[query] * chains, batch=np.zeros(chains, np.int64))
        yield pa.concat_tables([read, written]), _edges(rows, out, query, 0, 3, 1)
        rows, read = out, written
