"""Compaction's two ways of finding connected components, on the same stores in one run (issue 47).

Writes stores as the indexer's shards do (``indexer.shard.Shard``, no broker or graph), one copy per
algorithm of ``compaction.COMPONENTS``, and for each shape and algorithm measures, in one Spark session
(``local[2]``, a 4 GB driver):

- ``components_seconds``: ``compaction.components`` alone over the store's edges (read and cached first);
- ``compaction_seconds``: ``compact`` of the whole store (its manifest's ``seconds``), and ``sets_seconds``
  (components and the splits of the large ones, from the manifest);
- ``identical``: whether both algorithms gave every rid the same component, and both generations the same
  rid → set mapping.

Shapes: ``workload`` (``bench.workload.lineage_messages``, the indexer bench's lineage: components of small
diameter) at each of ``--edges``, and ``chain`` (``bench.workload.chain_messages``: ``--chains`` paths of
``--hops`` edges, a component as deep as it is long). Ratios are GraphX's seconds over large-star's. Prints
one JSON line.

    .venv/bin/python bench/compaction_components.py [--edges 1000000,3000000] [--chains 1000] [--hops 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import chain_messages, lineage_messages  # noqa: E402

TOPIC = "bench.edges"


def write_store(store_dir: Path, messages, partitions: int = 2, per_write: int = 6) -> int:
    """The messages into ``partitions`` shards, ``per_write`` messages a write, as the indexer writes them."""
    import pyarrow as pa

    from headwater.indexer.shard import Shard

    shards = [Shard(store_dir, TOPIC, p).open() for p in range(partitions)]
    written = 0
    for i in range(0, len(messages), per_write):
        take = messages[i: i + per_write]
        shard = shards[(i // per_write) % partitions]
        edges = pa.concat_tables([e for _, e in take])
        shard.write(pa.concat_tables([n for n, _ in take]), edges, shard.resume, shard.resume + len(take) - 1)
        written += edges.num_rows
    return written


def rid_mapping(table, value: str):
    """``(rids, values)`` sorted by rid, as numpy arrays."""
    import numpy as np

    rids = table["rid"].to_numpy()
    order = np.argsort(rids, kind="stable")
    return rids[order], table[value].to_numpy()[order]


def same(a, b) -> bool:
    import numpy as np

    return bool(len(a[0]) == len(b[0]) and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))


def measure(spark, root: Path, shape: str, messages, algorithms: list[str]) -> dict:
    import pyarrow.dataset as ds

    from headwater.indexer.compaction import STORE_DDL, compact, components
    from headwater.store.generation import Generation, Snapshot

    base = root / f"{shape}-base"
    edges = write_store(base, messages)
    result: dict = {"edges": edges}
    labels, sets = {}, {}
    for algorithm in algorithms:
        store = root / f"{shape}-{algorithm}"
        shutil.copytree(base, store)
        snap = Snapshot.of(store, TOPIC)
        edge_files = [snap.tables.edges.file_path(f["path"]) for f in snap.shard_files]
        frame = spark.read.schema(STORE_DDL).parquet(*edge_files).select("src", "dst").localCheckpoint()
        started = time.monotonic()
        found = components(frame, algorithm=algorithm).localCheckpoint()
        seconds = round(time.monotonic() - started, 3)
        labels[algorithm] = rid_mapping(found.toArrow(), "component")
        manifest = compact(spark, store, TOPIC, components=algorithm,
                           say=lambda s: print(f"{shape} {algorithm}: {s}", file=sys.stderr, flush=True))
        gen = Generation.current(store, TOPIC)
        sets[algorithm] = rid_mapping(ds.dataset(gen.row_files(), format="parquet").to_table(), "set")
        result[algorithm] = {"components_seconds": seconds, "compaction_seconds": manifest["seconds"],
                             "sets_seconds": manifest["sets_seconds"], "components": len(set(labels[algorithm][1])),
                             "sets": manifest["sets"], "largest_set": manifest["largest_set"]}
        print(json.dumps({shape: result[algorithm], "algorithm": algorithm}), file=sys.stderr, flush=True)
        shutil.rmtree(store)
    shutil.rmtree(base)
    first, *others = algorithms
    for other in others:
        for figure in ("components_seconds", "compaction_seconds"):
            result[f"{other}_over_{first}_{figure}"] = round(result[other][figure] / result[first][figure], 3)
    result["identical"] = all(same(labels[first], labels[o]) and same(sets[first], sets[o]) for o in others)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", default="1000000", help="Sizes of the workload shape, comma separated.")
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument("--hops", type=int, default=100, help="Edges in each chain (0: no chain shape).")
    args = parser.parse_args()

    from headwater.adapters.spark import spark_session
    from headwater.indexer.compaction import COMPONENTS, DEFAULT_COMPONENTS

    algorithms = [DEFAULT_COMPONENTS] + [a for a in COMPONENTS if a != DEFAULT_COMPONENTS]
    spark = spark_session("headwater-bench-components", **{"spark.driver.memory": "4g"})
    results: dict = {"algorithms": algorithms, "default": DEFAULT_COMPONENTS}
    try:
        with tempfile.TemporaryDirectory(prefix="headwater-components-") as tmp:
            root = Path(tmp)
            # Warm the JVM's code paths of both, so the first measured run pays no more than the second.
            measure(spark, root, "warmup", list(lineage_messages(5_000, seed=9, edges_per_message=1000)), algorithms)
            for size in [int(s) for s in args.edges.split(",") if s]:
                messages = list(lineage_messages(size, seed=1, edges_per_message=5000))
                results[f"workload_{size}"] = measure(spark, root, f"workload_{size}", messages, algorithms)
            if args.hops:
                messages = list(chain_messages(args.chains, args.hops, seed=3))
                results[f"chain_{args.chains}x{args.hops}"] = measure(spark, root, "chain", messages, algorithms)
    finally:
        spark.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
