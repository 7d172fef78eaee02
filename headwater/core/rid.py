"""Row ids (rids): deterministic signed 64-bit names for rows.

Capture computes rids inside Spark with its ``xxhash64`` function; this module is its
exact twin in plain Python, so the query tier can turn source coordinates into rids
(``kafka:orders:0:17`` → rid) and tests can check Spark's rids without Spark.

Spark's ``xxhash64(c1, c2, …)`` chains XXH64 over its arguments, each argument's hash
seeding the next, starting from seed 42; strings hash as their UTF-8 bytes, ints as 4
little-endian bytes, longs as 8. Nulls are skipped.
"""

from __future__ import annotations

import struct

# Namespaces: the first hashed value of every rid, so rows of different kinds never
# share a rid even when their coordinates coincide.
KAFKA = "kafka"
TABLE = "table"
FILE = "file"
RATE = "rate"
STATE = "state"
OUTPUT = "out"

SPARK_SEED = 42

# Between the parts of a composite static-table key, in a rid and in a row's ``key``.
KEY_SEPARATOR = "\x1f"

_M = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M
    return (_rotl(acc, 31) * _P1) & _M


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M


def xxh64(data: bytes, seed: int) -> int:
    """Standard XXH64 of ``data``, as an unsigned 64-bit integer."""
    seed &= _M
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M
        v2 = (seed + _P2) & _M
        v3 = seed
        v4 = (seed - _P1) & _M
        while i + 32 <= n:
            a, b, c, d = struct.unpack_from("<4Q", data, i)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        (k,) = struct.unpack_from("<I", data, i)
        h ^= (k * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    h ^= h >> 32
    return h


class Int(int):
    """An integer Spark holds as a 32-bit ``int`` (hashed as 4 bytes, not 8)."""


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def spark_xxhash64(*values) -> int:
    """What Spark's ``xxhash64(values…)`` returns for these literals.

    ``str`` hashes as a string, ``Int`` as a Spark int, any other ``int`` as a long,
    ``None`` is skipped.
    """
    h = SPARK_SEED
    for value in values:
        if value is None:
            continue
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, bool):
            data = struct.pack("<i", int(value))
        elif isinstance(value, Int):
            data = struct.pack("<i", value)
        elif isinstance(value, int):
            data = struct.pack("<q", value)
        else:
            raise TypeError(f"no Spark hash twin for {type(value).__name__}: {value!r}")
        h = xxh64(data, h)
    return _signed(h)


def kafka_rid(topic: str, partition: int, offset: int) -> int:
    """The rid of the Kafka record at ``topic``/``partition``/``offset``."""
    return spark_xxhash64(KAFKA, topic, Int(partition), offset)


def table_rid(table: str, key: str | tuple[str, ...]) -> int:
    """The rid of the row of static table ``table`` whose key (as text) is ``key``.

    A composite key is given as a tuple of its parts as text.
    """
    text = key if isinstance(key, str) else KEY_SEPARATOR.join(key)
    return spark_xxhash64(TABLE, table, text)


def file_rid(path: str, position: int) -> int:
    """The rid of the row at ``position`` (0-based) of the file at ``path`` (as Spark names it)."""
    return spark_xxhash64(FILE, path, position)


def rate_rid(value: int) -> int:
    """The rid of the rate source's row ``value``."""
    return spark_xxhash64(RATE, value)


# The op id of a query's foreachBatch user code, which lies past its plan.
FOREACH_BATCH_OP = -1


def state_rid(query: str, op: int, batch: int | None = None) -> int:
    """The rid of the state node of black-box operator ``op`` of ``query``.

    A stateless black box gets one node per batch (its outputs derive from that batch's
    inputs); a stateful one a single node (its outputs may derive from any earlier input).
    The user's foreachBatch code is the black box ``FOREACH_BATCH_OP``, one node per batch.
    """
    return spark_xxhash64(STATE, query, Int(op), batch)
