"""Connected sets (CSProv, ``papers/csprov…`` §III–IV): the partitioning of the Parquet store.

Pure numpy, no Spark. Rows are rids; edges run from ``src`` to ``dst``; every row
belongs to one dataset (a Kafka topic, a static table, a sink, a black box's state).

- ``components`` labels the weakly connected components of an edge list, by hooking
  and pointer jumping (the large-star/small-star idea, vectorized): O(log n) rounds.
- ``connected_sets`` is Algorithm 3: components no larger than ``threshold`` rows are
  sets as they are; a larger one is split along the dataset graph into splits, each
  weakly connected in that graph, and the components of each split's subgraph are its
  sets (recursively, while a set is still too large and its split has more than one
  dataset). A set's id is its smallest rid, so it is the same whoever computes it.
- ``set_dependencies`` lists the pairs (set of src, set of dst) that edges cross: the
  sets a query must read for a row's lineage are its set and that set's ancestors
  there.

How a split is divided: its hub (the dataset whose rows have the most edges inside the
component, such as a dimension table every order joins) becomes a split of its own, and
the rest falls into its weakly connected parts. Sets inside one split never depend on
each other (they are components of one subgraph), which keeps dependencies few (C1).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def components(src: np.ndarray, dst: np.ndarray, nodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rids, label)``: each rid of the edges (and of ``nodes``) with its component's smallest rid.

    ``rids`` is sorted and unique; isolated ``nodes`` are components of their own.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    parts = [src, dst] + ([np.asarray(nodes, dtype=np.int64)] if nodes is not None else [])
    rids, at = np.unique(np.concatenate(parts), return_inverse=True)  # at: each end's place among the rids
    s, d = at[:len(src)], at[len(src):len(src) + len(dst)]
    parent = np.arange(len(rids))
    while True:
        ps, pd = parent[s], parent[d]
        lo, hi = np.minimum(ps, pd), np.maximum(ps, pd)
        apart = lo != hi
        if not apart.any():
            break
        # Hook each root onto the smallest root an edge joins it to, then flatten.
        np.minimum.at(parent, hi[apart], lo[apart])
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped
    # Rids are sorted, so a component's smallest index is its smallest rid.
    return rids, rids[parent]


def _label_of(rids: np.ndarray, labels: np.ndarray, values: np.ndarray) -> np.ndarray:
    return labels[np.searchsorted(rids, values)]


def dataset_graph(src_ds: np.ndarray, dst_ds: np.ndarray) -> set[tuple[str, str]]:
    """The dataset-level edges of a lineage graph: which dataset's rows derive which's."""
    return {(a, b) for a, b in zip(src_ds.tolist(), dst_ds.tolist()) if a != b}


def _weak_parts(datasets: set, links: set[tuple[str, str]]) -> list[set]:
    """The weakly connected parts of ``datasets`` in the dataset graph ``links``."""
    neighbours = defaultdict(set)
    for a, b in links:
        if a in datasets and b in datasets:
            neighbours[a].add(b)
            neighbours[b].add(a)
    parts, seen = [], set()
    for start in sorted(datasets):
        if start in seen:
            continue
        part, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node not in part:
                part.add(node)
                todo.extend(neighbours[node] - part)
        seen |= part
        parts.append(part)
    return parts


def _subsplits(split: set, hub: str, links: set[tuple[str, str]]) -> list[set]:
    return [{hub}] + _weak_parts(split - {hub}, links)


def connected_sets(src: np.ndarray, dst: np.ndarray, rid_dataset: dict, threshold: int,
                   nodes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rids, set_id)``: the connected set of every row (Algorithm 3).

    ``rid_dataset`` maps every rid to its dataset; ``threshold`` is the most rows a set
    may hold unless it cannot be split further (one dataset).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    rids, labels = components(src, dst, nodes)
    set_of = labels.copy()
    datasets = np.array([rid_dataset[r] for r in rids.tolist()], dtype=object)
    src_ds = datasets[np.searchsorted(rids, src)]
    dst_ds = datasets[np.searchsorted(rids, dst)]
    links = dataset_graph(src_ds, dst_ds)
    sizes = dict(zip(*np.unique(labels, return_counts=True)))
    edge_label = _label_of(rids, labels, dst)
    for label, size in sizes.items():
        if size <= threshold:
            continue
        members = np.flatnonzero(labels == label)
        inside = edge_label == label
        split = set(datasets[members].tolist())
        _partition(rids[members], datasets[members], src[inside], dst[inside], src_ds[inside], dst_ds[inside],
                   _weak_parts(split, links), links, threshold, rids, set_of)
    return rids, set_of


def _partition(members, member_ds, src, dst, src_ds, dst_ds, splits, links, threshold, rids, set_of) -> None:
    """PartitionLargeComponent: set ids for ``members`` (rows of one component), written into ``set_of``."""
    for split in splits:
        in_split = np.isin(member_ds, list(split))
        rows = members[in_split]
        both = np.isin(src_ds, list(split)) & np.isin(dst_ds, list(split))
        sub_rids, sub_labels = components(src[both], dst[both], rows)
        set_of[np.searchsorted(rids, sub_rids)] = sub_labels
        if len(split) == 1:
            continue  # one dataset: its components are as small as sets get
        sizes = dict(zip(*np.unique(sub_labels, return_counts=True)))
        for label, size in sizes.items():
            if size <= threshold:
                continue
            inner = sub_rids[sub_labels == label]
            inner_ds = member_ds[in_split][np.searchsorted(rows, inner)]  # rows are sorted: from np.unique
            edges = both & np.isin(dst, inner)
            hub = _hub(src[edges], dst[edges], src_ds[edges], dst_ds[edges])
            _partition(inner, inner_ds, src[edges], dst[edges], src_ds[edges], dst_ds[edges],
                       _subsplits(split, hub, links), links, threshold, rids, set_of)


def _hub(src, dst, src_ds, dst_ds) -> str:
    """The dataset whose rows have the most edges, one row at its busiest."""
    degree: dict = defaultdict(int)
    for rid, ds in zip(np.concatenate([src, dst]).tolist(), np.concatenate([src_ds, dst_ds]).tolist()):
        degree[(ds, rid)] += 1
    busiest = max(degree.items(), key=lambda item: (item[1], item[0][0]))
    return busiest[0][0]


def set_dependencies(src: np.ndarray, dst: np.ndarray, rids: np.ndarray, set_of: np.ndarray) -> np.ndarray:
    """Distinct ``(src set, dst set)`` pairs of the edges that cross sets, as an (n, 2) array."""
    a = _label_of(rids, set_of, np.asarray(src, dtype=np.int64))
    b = _label_of(rids, set_of, np.asarray(dst, dtype=np.int64))
    crossing = a != b
    return unique_pairs(a[crossing], b[crossing])


def unique_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distinct ``(a, b)`` pairs, sorted, as an (n, 2) array (``np.unique(…, axis=0)``, at a third of its
    cost)."""
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])] if len(a) else np.zeros(0, dtype=bool)
    return np.stack([a[keep], b[keep]], axis=1)
