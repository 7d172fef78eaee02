"""Scala values for Spark's own sink code, built through py4j."""

from __future__ import annotations

from typing import TYPE_CHECKING

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject

OUTPUT_MODES = ("append", "update", "complete")


def scala_map(jvm, mapping: dict) -> JavaObject:
    return jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(java_map(jvm, mapping))


def java_map(jvm, mapping: dict) -> JavaObject:
    result = jvm.java.util.HashMap()
    for key, value in mapping.items():
        result.put(key, value)
    return result


def case_insensitive(jvm, options: dict) -> JavaObject:
    return jvm.org.apache.spark.sql.util.CaseInsensitiveStringMap(java_map(jvm, options))


def output_mode(jvm, mode: str) -> JavaObject:
    modes = jvm.org.apache.spark.sql.streaming.OutputMode
    return {"append": modes.Append, "update": modes.Update, "complete": modes.Complete}[mode.lower()]()


def java_schema(spark: SparkSession, schema: StructType) -> JavaObject:
    return spark._jsparkSession.parseDataType(schema.json())


def is_instance(jvm, class_name: str, value) -> bool:
    """Whether ``value`` is of the JVM class ``class_name``; false where the JVM has no such class (a Spark
    line without it)."""
    try:
        return bool(jvm.java.lang.Class.forName(class_name).isInstance(value))
    except Py4JError:
        return False


def message(exc: Exception) -> str:
    """The first line of an exception from the JVM, which is what says what went wrong."""
    java = getattr(exc, "java_exception", None)  # py4j's own error says only which call failed
    text = str((java.getMessage() if java is not None else None) or exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__
