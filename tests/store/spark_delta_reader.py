"""A user's Spark reading the lineage tables: plain PySpark and Delta's connector, no headwater import.

Run as a program by ``test_table_readers`` (a session of its own: Delta's extension and catalog are set when
a session starts). Reads a JSON job on stdin, ``{"jars", "edges", "rows", "version", "sql", "params": [...],
"batch_log", "log_sql", "log_params": [...]}``, and prints one JSON line: every edge now and the count at
``version``, the SQL's rids for each params, and the batch log SQL's ``[query, batch]`` rows for each of its
params.
"""

import json
import re
import sys

from pyspark.sql import SparkSession


def with_values(sql: str, params: dict) -> str:
    """The SQL with its ``:name`` parameters as literals: Spark 4.2 with Delta's extension binds none inside a
    recursive CTE, nor in the batch log's question (UNBOUND_SQL_PARAMETER)."""
    def literal(match: re.Match) -> str:
        value = params[match.group(1)]
        return str(int(value)) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"
    return re.sub(r":(\w+)", literal, sql)


job = json.load(sys.stdin)
spark = (SparkSession.builder.master("local[2]").appName("a user's Spark")
         .config("spark.jars", ",".join(job["jars"]))
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config("spark.ui.enabled", "false").getOrCreate())
try:
    spark.read.format("delta").load(job["edges"]).createOrReplaceTempView("edges")
    spark.read.format("delta").load(job["rows"]).createOrReplaceTempView("rows")
    spark.read.format("delta").load(job["batch_log"]).createOrReplaceTempView("batch_log")
    found = {
        "edges": [list(r) for r in spark.sql("SELECT src, dst, query, batch FROM edges").collect()],
        "count_at_version": spark.read.format("delta").option("versionAsOf", job["version"]).load(job["edges"]).count(),
        "answers": [sorted(r.rid for r in spark.sql(with_values(job["sql"], params)).collect())
                    for params in job["params"]],
        "log_answers": [[[r.query, r.batch] for r in spark.sql(with_values(job["log_sql"], params)).collect()]
                        for params in job["log_params"]],
    }
    print(json.dumps(found))
finally:
    spark.stop()
