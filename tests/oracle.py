"""Brute-force lineage of the demo pipeline, recomputed in plain Python from its inputs.

The demo pipeline keeps an order when its value parses as an order with numeric
order_id, customer_id and amount, the amount is at least 20, and a customers row has
its customer_id; each such order yields one output row that derives from exactly its
Kafka record and that customers row.
"""

from __future__ import annotations

import json

from headwater.demo.pipeline import MIN_AMOUNT

# ("kafka", topic, partition, offset), ("table", name, key), ("file", file name, position)
# or ("rate", value)
Input = tuple


def parse(value: bytes):
    try:
        order = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(order, dict):
        return None
    for field in ("order_id", "customer_id", "amount"):
        v = order.get(field)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
    return order


def demo_lineage(topic: str, events, coordinates, customers) -> dict[int, set[Input]]:
    """order_id of each output row → the set of inputs it derives from."""
    known = {c["customer_id"] for c in customers}
    expected = {}
    for (_, value), (partition, offset) in zip(events, coordinates):
        order = parse(value)
        if order is None or order["amount"] < MIN_AMOUNT or order["customer_id"] not in known:
            continue
        expected[order["order_id"]] = {
            ("kafka", topic, partition, offset),
            ("table", "customers", str(order["customer_id"])),
        }
    return expected


def derived_from(lineage: dict[int, set[Input]]) -> dict[Input, set[int]]:
    """Forward lineage from backward (``demo_lineage``): each input → the order_ids of the
    output rows derived from it. An input no output row derives from is not in it."""
    derived: dict[Input, set[int]] = {}
    for order, inputs in lineage.items():
        for item in inputs:
            derived.setdefault(item, set()).add(order)
    return derived


def as_input(row) -> Input:
    """A lineage answer row (``Lineage``) in the oracle's terms."""
    if row.topic is not None:
        return ("kafka", row.topic, row.partition, row.offset)
    if row.path is not None:
        return ("file", row.path.rsplit("/", 1)[-1], row.position)
    if row.dataset == "rate":
        return ("rate", int(row.key))
    # A static table's row: by its table's short name, whether the record shows it or, unshown (the
    # fallback's own records), names the table by where it lives.
    from headwater.core.rid import dataset_table
    from headwater.query.datasets import short_name

    return ("table", short_name(row.dataset) if dataset_table(row.dataset) else row.dataset, row.key)
