"""Datasets as OpenLineage names them: a ``namespace`` (the datasource) and a ``name`` (the dataset in it).

OpenLineage's naming spec (``spec/Naming.md``) and its Spark agent's reading of it, which catalogs then join on:

- Kafka: ``kafka://{host}:{port}`` of the first bootstrap server, the topic as the name;
- a local file or folder: ``file``, its absolute path (no trailing slash);
- object stores: ``s3://{bucket}`` (``s3a``/``s3n`` too), ``gs://{bucket}``, ``abfss://{container}@{account}``
  (``abfs`` too), ``wasbs://…`` (``wasb`` too), the path in the bucket without its leading slash;
- any other file system (HDFS…): ``{scheme}://{authority}``, the path;
- a catalog table with no location: the catalog (``hive://{host}:{port}`` of a Hive metastore, else the Spark
  catalog's name, ``spark_catalog``), ``{database}.{table}``.

The two together form a URI (``namespace/name``: ``kafka://broker:9092/orders``, ``file:/data/out``,
``s3://bucket/out``): what ``headwater lineage … --to`` and the explorer accept beside headwater's own names
(``uri`` and ``parse``). A traced query's datasets are read off its plan record (``reads``, ``written``), so
capture's events (``capture/openlineage.py``) and the query tier (``query/api.py``'s ``target``) name them alike.
Pure.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, NamedTuple
from urllib.parse import urlsplit

# Object stores: the schemes a path may come with, and the one the namespace gives.
_OBJECT_STORES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "abfs": "abfss", "abfss": "abfss",
                  "wasb": "wasbs", "wasbs": "wasbs"}
_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
_PROTOCOL = re.compile(r"^\w+://")


class DatasetName(NamedTuple):
    namespace: str
    name: str

    @property
    def uri(self) -> str:
        """The URI the two form: ``kafka://broker:9092/orders``, ``file:/data/out``, ``s3://bucket/out``."""
        if self.namespace == "file":
            return f"file:{self.name}"
        if "://" in self.namespace:
            return f"{self.namespace.rstrip('/')}/{self.name.lstrip('/')}"
        return f"{self.namespace}/{self.name}"  # a catalog: spark_catalog/db.table


def kafka(bootstrap: str, topic: str) -> DatasetName:
    """A Kafka topic read or written through ``bootstrap`` (``host:port[,host:port…]``, maybe ``PROTOCOL://``)."""
    first = _PROTOCOL.sub("", bootstrap.split(",")[0].strip())  # SASL_SSL://host:port: a listener's protocol
    parsed = urlsplit(f"kafka://{first}")
    return DatasetName(f"kafka://{parsed.hostname}:{parsed.port}", topic)


def location(path: str) -> DatasetName:
    """A file or folder, by its path as Spark resolved it (``file:/data/out``, ``s3a://bucket/out``, ``/data``)."""
    parsed = urlsplit(path)
    scheme = (parsed.scheme or "file").lower()
    if scheme == "file":
        return DatasetName("file", _no_trailing_slash(parsed.path) or "/")
    if scheme in _OBJECT_STORES:
        name = _no_trailing_slash(parsed.path).lstrip("/")
        return DatasetName(f"{_OBJECT_STORES[scheme]}://{parsed.netloc}", name or "/")
    return DatasetName(f"{scheme}://{parsed.netloc}", _no_trailing_slash(parsed.path) or "/")


def catalog_table(table: str, metastore: str | None = None) -> DatasetName:
    """A catalog table with no location, by its qualified name (``spark_catalog.db.table``): in its Hive metastore
    (``metastore``: ``thrift://host:9083``, Spark's ``hive.metastore.uris``) where one is set, else in its catalog."""
    parts = table.split(".")
    catalog, name = (parts[0], ".".join(parts[1:])) if len(parts) > 2 else ("spark_catalog", table)
    if metastore and catalog == "spark_catalog":
        first = urlsplit(metastore.split(",")[0].strip())
        return DatasetName(f"hive://{first.hostname}:{first.port}", name)
    return DatasetName(catalog, name)


def parse(text: str) -> DatasetName | None:
    """An OpenLineage URI (``DatasetName.uri``) back into namespace and name; None where ``text`` is not one
    (``kafka:orders``, headwater's own name of a topic, is not: it has no ``//``)."""
    scheme = _URI.match(text)
    if scheme is None:
        return None
    if scheme.group(1).lower() == "file":
        rest = text[len("file:"):]
        if rest.startswith("//"):
            rest = urlsplit(text).path
        return DatasetName("file", _no_trailing_slash(rest) or "/") if rest.startswith("/") else None
    if "://" not in text:
        return None
    parsed = urlsplit(text)
    if not parsed.netloc:
        return None
    namespace = f"{parsed.scheme}://{parsed.netloc}"
    name = parsed.path[1:] if parsed.scheme in ("kafka", *_OBJECT_STORES.values(), "hive") else parsed.path
    return DatasetName(namespace, _no_trailing_slash(name) or "/")


def _no_trailing_slash(path: str) -> str:
    return path[:-1] if len(path) > 1 and path.endswith("/") else path


class Read(NamedTuple):
    """A dataset a source node of a plan reads: its name, its columns (``[name, type]``) and, for a file-backed
    catalog table, the table's name (its ``symlinks`` facet)."""

    name: DatasetName
    columns: list
    table: str | None = None


def plan_nodes(ir: dict) -> dict[int, dict]:
    """The nodes of a plan record's IR (``PlanNode.to_dict``) by id."""
    found: dict[int, dict] = {}
    stack = [ir]
    while stack:
        node = stack.pop()
        found[node["id"]] = node
        stack.extend(node.get("children") or [])
    return found


def kafka_bootstrap(node: dict) -> str:
    """A Kafka source node's brokers, as its reader named them (``spark_plan._kafka_location``)."""
    return ((node["detail"].get("location") or {}).get("kafka") or {}).get("bootstrap") or "unknown:0"


def declared_topics(node: dict) -> list[str]:
    """The topics a Kafka source node names (``subscribe``, ``assign``); none for a pattern."""
    kafka_ = (node["detail"].get("location") or {}).get("kafka") or {}
    if kafka_.get("subscribe"):
        return [t.strip() for t in kafka_["subscribe"].split(",") if t.strip()]
    if kafka_.get("assign"):
        try:
            return sorted(json.loads(kafka_["assign"]))
        except (ValueError, TypeError):
            return []
    return []


def reads(node: dict, topics: Iterable[str] = (), metastore: str | None = None) -> list[Read]:
    """The datasets a source node of a plan record reads: a Kafka source's topics (those it names, and
    ``topics``: those its offsets showed, for a pattern), a file stream's folders, a static table's files and
    catalog tables; none for Spark's rate source, a black box or rows made in memory."""
    detail = node["detail"]
    columns = [[a[0], a[2]] for a in node.get("output") or []]
    kind = detail.get("source")
    if kind == "kafka":
        return [Read(kafka(kafka_bootstrap(node), topic), columns)
                for topic in sorted(set(declared_topics(node)) | set(topics))]
    if kind == "file":
        location_ = detail.get("location") or {}
        return [Read(location(p), location_.get("columns") or columns) for p in location_.get("paths") or []]
    if kind != "static":
        return []
    found, placed = [], set()
    for relation in detail.get("locations") or []:
        if relation.get("table"):
            placed.add(relation["table"])
        found += [Read(location(p), relation.get("columns") or [], relation.get("table"))
                  for p in relation.get("paths") or []]
    for part in (detail.get("table") or "").split(","):
        if part.startswith("catalog:") and part[len("catalog:"):] not in placed:
            found.append(Read(catalog_table(part[len("catalog:"):], metastore), columns))
    return found


def written(plan: dict, metastore: str | None = None) -> DatasetName | None:
    """The dataset a plan record's sink writes (its ``sink_location``); None for a sink that is the user's own code
    (foreachBatch, foreach) or Spark's console and memory sinks, and for a plan logged before sinks were located."""
    sink = plan.get("sink_location") or {}
    if sink.get("kafka"):
        return kafka(sink["kafka"]["bootstrap"], sink["kafka"]["topic"])
    if sink.get("path"):
        return location(sink["path"])
    if sink.get("table"):
        return catalog_table(sink["table"], metastore)
    return None
