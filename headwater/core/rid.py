"""Row ids (rids): deterministic signed 64-bit names for rows.

Capture computes rids inside Spark with its ``xxhash64`` function; this module is its
exact twin in plain Python, so the query tier can turn source coordinates into rids
(``kafka:orders:0:17`` → rid) and tests can check Spark's rids without Spark.

Spark's ``xxhash64(c1, c2, …)`` chains XXH64 over its arguments, each argument's hash
seeding the next, starting from seed 42; strings hash as their UTF-8 bytes, ints as 4
little-endian bytes, longs as 8. Nulls are skipped. ``table_row_rid`` follows Spark's
rules for every other flat column type, for rows named by their whole content.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
import struct

# Namespaces: the first hashed value of every rid, so rows of different kinds never
# share a rid even when their coordinates coincide.
KAFKA = "kafka"
TABLE = "table"
FILE = "file"
RATE = "rate"
STATE = "state"
OUTPUT = "out"
BOX_OUTPUT = "bbout"  # a black box's output row, named by its digest (``box_output_digests``)

SPARK_SEED = 42

# A static table's rows' dataset: this, then the table's identity (``table_dataset``).
TABLE_DATASET = "table:"

# Between the parts of a composite static-table key, in a rid and in a row's ``key``.
KEY_SEPARATOR = "\x1f"

_M = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
# Their inverses modulo 2**64, to undo a multiplication (``kafka_offset``).
_P1_INVERSE = pow(_P1, -1, 1 << 64)
_P2_INVERSE = pow(_P2, -1, 1 << 64)
_P3_INVERSE = pow(_P3, -1, 1 << 64)


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


def _kafka_seed(topic: str, partition: int) -> int:
    """What ``kafka_rid`` hashes a record's offset with: the hash of the rest, unsigned."""
    return spark_xxhash64(KAFKA, topic, Int(partition)) & _M


def kafka_rids(topic: str, partition: int, offsets):
    """``kafka_rid`` of each of ``offsets`` (numbers, or a numpy array) of ``topic``/``partition``, vectorised
    with numpy (a black box's 1,000,000 input records read back: 70 s value by value); an int64 array."""
    import numpy as np

    seed = np.uint64(_kafka_seed(topic, partition))
    with np.errstate(over="ignore"):
        return _xxh64_longs(np.asarray(offsets, dtype=np.int64).view(np.uint64), seed).view(np.int64)


def kafka_offset(rid: int, topic: str, partition: int) -> int:
    """The one offset whose record in ``topic``/``partition`` has rid ``rid`` (``kafka_rid`` undone).

    ``kafka_rid``'s last step is XXH64 of the offset's 8 bytes, seeded by the hash of the
    rest, and each of its steps is a bijection of 64-bit words (odd multipliers, rotations,
    xor-shifts): undone in reverse they give the offset, so whether a batch read a record
    is a check of its offset ranges, not a scan. The offset may lie outside any range read
    (a rid of another partition, or of no Kafka record, still maps to some offset).
    """
    seed = _kafka_seed(topic, partition)
    h = rid & _M
    h ^= h >> 32
    h = (h * _P3_INVERSE) & _M
    h ^= (h >> 29) ^ (h >> 58)
    h = (h * _P2_INVERSE) & _M
    h ^= h >> 33
    h = _rotl(((h - _P4) * _P1_INVERSE) & _M, 64 - 27)
    lane = h ^ ((seed + _P5 + 8) & _M)  # _round(0, offset)
    return _signed((_rotl((lane * _P1_INVERSE) & _M, 64 - 31) * _P2_INVERSE) & _M)


def table_dataset(table: str) -> str:
    """The dataset lineage rows of static table ``table`` (its identity, ``plan.static_table``) carry."""
    return TABLE_DATASET + table


def dataset_table(dataset: str | None) -> str | None:
    """The static table whose rows carry ``dataset`` (``table_dataset`` undone); None for other datasets."""
    return dataset[len(TABLE_DATASET):] if dataset and dataset.startswith(TABLE_DATASET) else None


def table_rid(table: str, key: str | tuple[str, ...]) -> int:
    """The rid of the row of static table ``table`` (its identity, ``plan.static_table``:
    where its rows live, not its short name) whose key (as text) is ``key``.

    A composite key is given as a tuple of its parts as text.
    """
    text = key if isinstance(key, str) else KEY_SEPARATOR.join(key)
    return spark_xxhash64(TABLE, table, text)


class UnhashableType(TypeError):
    """A column type whose Spark hash this module does not reproduce: no rid is given for it."""


_EPOCH_DAY = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)
_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)")
_MAX_LONG_DIGITS = 18  # Spark's Decimal.MAX_LONG_DIGITS: up to it, a decimal hashes as its unscaled long
# Type names as ``DataFrame.dtypes`` gives them, where a logged plan names them otherwise.
_SIMPLE_NAMES = {"tinyint": "byte", "smallint": "short", "int": "integer", "bigint": "long"}
_INTS = frozenset({"byte", "short", "integer"})
_LONGS = frozenset({"long", "timestamp", "timestamp_ntz"})
_EXACT = decimal.Context(prec=200)  # wider than any decimal(38, s) times 10**38


def table_row_rid(table: str, values, dtypes) -> int:
    """The rid capture gives a row of static table ``table`` without a declared key.

    Capture hashes the row's whole content, ``xxhash64('table', table, c1, c2, …)`` over
    its columns in order; ``values`` are the row's values and ``dtypes`` their Spark types
    as a logged plan names them (``integer``, ``decimal(15,2)``…, or ``int``, ``bigint``…
    as ``DataFrame.dtypes`` does). As Spark hashes them:
    NULL leaves the hash as it is; boolean as the int 1 or 0; byte, short, int and date
    (days since 1970-01-01) as ints; long, timestamp and timestamp_ntz (microseconds since
    1970-01-01 00:00, UTC for timestamps) as longs; float and double as their IEEE bits,
    -0.0 as 0.0 and every NaN as Java's one NaN (``floatToIntBits``, ``doubleToLongBits``);
    string as its UTF-8 bytes, binary as its bytes; a decimal of precision up to 18 as its
    unscaled long, a wider one as the unscaled integer's two's-complement big-endian bytes
    (Java's ``BigInteger.toByteArray``).

    NULL is ``None``, pandas' ``NA`` or ``NaT``, or, outside float and double columns, a
    NaN. In a float or double column a NaN is a NaN, which Spark hashes: values read
    without loss are pyarrow's (``to_pylist``) or pandas' with ``dtype_backend="pyarrow"``;
    pandas' default reading turns NULLs of float columns into NaN and nullable longs into
    floats, which lose digits past 2**53. A type not listed above (array, struct, map,
    interval, a collated string…) raises ``UnhashableType``, whatever the values.
    """
    if len(values) != len(dtypes):
        raise ValueError(f"{len(values)} values for {len(dtypes)} column types")
    return _row_hash(TABLE, table, dtypes)(values)


def table_row_rids(table: str, columns, dtypes) -> list[int]:
    """``table_row_rid`` of every row of a table given by its ``columns`` (each a sequence of values)."""
    return _row_rids(TABLE, table, columns, dtypes)


def file_row_rids(path: str, columns, dtypes) -> list[int]:
    """The rids capture gives the rows of a JSON, CSV or text file stream's file ``path`` (as Spark names it),
    which have no position: ``xxhash64('file', path, c1, c2, …)`` over every column, as ``table_row_rid``."""
    return _row_rids(FILE, path, columns, dtypes)


def _row_rids(namespace: str, name: str, columns, dtypes) -> list[int]:
    if len(columns) != len(dtypes):
        raise ValueError(f"{len(columns)} columns for {len(dtypes)} column types")
    row_hash = _row_hash(namespace, name, dtypes)
    return [row_hash(values) for values in zip(*columns)]


def _row_hash(namespace: str, name: str, dtypes):
    dtypes = [_SIMPLE_NAMES.get(dtype, dtype) for dtype in dtypes]
    hashers = list(zip(dtypes, [_hasher(dtype) for dtype in dtypes]))
    seed = spark_xxhash64(namespace, name) & _M

    def row_hash(values) -> int:
        h = seed
        for value, (dtype, hasher) in zip(values, hashers):
            if not _is_null(value, dtype):
                h = xxh64(hasher(value), h)
        return _signed(h)
    return row_hash


def _is_null(value, dtype: str) -> bool:
    if value is None:
        return True
    try:
        unequal = bool(value != value)  # NaN, NaT
    except TypeError:  # pandas' NA is neither equal nor unequal to itself
        return True
    return unequal and dtype not in ("float", "double")


def _hasher(dtype: str):
    """The bytes Spark's XXH64 reads for a value of ``dtype``."""
    if dtype == "boolean":
        return lambda v: struct.pack("<i", 1 if v else 0)
    if dtype in _INTS:
        return lambda v: struct.pack("<i", int(v))
    if dtype == "long":
        return lambda v: struct.pack("<q", int(v))
    if dtype == "date":
        return lambda v: struct.pack("<i", _days(v))
    if dtype in _LONGS:
        return lambda v: struct.pack("<q", _micros(v))
    if dtype == "float":
        return lambda v: struct.pack("<i", _float_bits(float(v), "<f", "<i", 0x7FC00000))
    if dtype == "double":
        return lambda v: struct.pack("<q", _float_bits(float(v), "<d", "<q", 0x7FF8000000000000))
    if dtype == "string":
        return lambda v: v.encode("utf-8")
    if dtype == "binary":
        return bytes
    match = _DECIMAL.fullmatch(dtype or "")
    if match:
        precision, scale = int(match.group(1)), int(match.group(2))
        if precision <= _MAX_LONG_DIGITS:
            return lambda v: struct.pack("<q", _unscaled(v, scale))
        return lambda v: _big_endian(_unscaled(v, scale))
    raise UnhashableType(f"no rid twin for Spark type {dtype or 'unknown (a nested type)'!r}: rows of a table "
                         f"with such a column are named by capture with a hash this module does not reproduce")


def _float_bits(v: float, float_format: str, int_format: str, nan: int) -> int:
    if math.isnan(v):
        return nan  # Java's canonical NaN: floatToIntBits and doubleToLongBits fold every NaN to it
    if v == 0.0:
        return 0  # Spark hashes -0.0 as 0.0
    return struct.unpack(int_format, struct.pack(float_format, v))[0]


def _days(v) -> int:
    if isinstance(v, datetime.datetime):
        v = v.date()
    elif not isinstance(v, datetime.date):  # numpy's datetime64
        return int(v.astype("datetime64[D]").astype("int64"))
    return (v - _EPOCH_DAY).days


def _micros(v) -> int:
    if isinstance(v, datetime.datetime):  # pandas' Timestamp too; Spark keeps no nanoseconds
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        delta = v - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(v.astype("datetime64[us]").astype("int64"))  # numpy's datetime64


def _unscaled(v, scale: int) -> int:
    """The decimal ``v`` as the integer Spark stores at ``scale``: ``v`` × 10**scale, which must be whole."""
    unscaled = _EXACT.scaleb(decimal.Decimal(v), scale)
    if unscaled != unscaled.to_integral_value():
        raise ValueError(f"{v} has more than {scale} decimal places")
    return int(unscaled)


def _big_endian(n: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: the fewest two's-complement big-endian bytes, sign bit included."""
    return n.to_bytes((n + (n < 0)).bit_length() // 8 + 1, "big", signed=True)


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


# A stateful operator's state nodes (an aggregate's groups) are named by the query, the
# operator, the input they gather and the group's key values: Spark's
# ``xxhash64(STATE, query, op, input, key values…)``, computed in the plan (the state key),
# then tied to the run, the checkpoint's query id, so a new checkpoint under the same
# query name starts new nodes while a restart from the checkpoint continues them.


def run_hash(query_id: str) -> int:
    """The run a state node belongs to: Spark's query id, which its checkpoint keeps across restarts."""
    return spark_xxhash64(STATE, query_id)


def state_node_rid(key: int, run: int) -> int:
    """The rid of the state node with state key ``key`` (as the plan computes it) in run ``run``."""
    return spark_xxhash64(key, run)


def state_node_rids(keys, run: int):
    """``state_node_rid`` of each of ``keys`` (a numpy int64 array), vectorised."""
    import numpy as np

    with np.errstate(over="ignore"):
        first = _xxh64_longs(keys.astype(np.int64).view(np.uint64), np.uint64(SPARK_SEED))
        second = _xxh64_longs(np.full(len(keys), run, dtype=np.int64).view(np.uint64), first)
    return second.view(np.int64)


def _xxh64_longs(values, seeds):
    """XXH64 of each 8-byte little-endian value with its seed (numpy uint64 arrays; wraps around)."""
    import numpy as np

    u = np.uint64
    h = seeds + u(_P5) + u(8)
    k = _rotl_numpy(values * u(_P2), 31) * u(_P1)
    h = h ^ k
    return _avalanche(_rotl_numpy(h, 27) * u(_P1) + u(_P4))


def _rotl_numpy(x, r: int):
    """Rotate numpy uint64s left by ``r`` bits."""
    import numpy as np

    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _avalanche(h):
    """XXH64's final mix of numpy uint64s (wrapping around)."""
    import numpy as np

    u = np.uint64
    h = h ^ (h >> u(33))
    h = h * u(_P2)
    h = h ^ (h >> u(29))
    h = h * u(_P3)
    return h ^ (h >> u(32))


# A black box's output rows are rows of the graph between its state node and the rows above it:
# each is named by the digest of its columns (computed in the plan, above the black box), tied to the
# black box's node of its batch, so equal rows of two batches stay apart.


def box_output_digests(dataset: str, columns, dtypes) -> list[int]:
    """The digest capture gives each output row of black box ``dataset`` (``<Spark class>#<node id>``):
    Spark's ``xxhash64('bbout', dataset, c…)`` over the columns it hashes (``table_row_rid``'s rules)."""
    return _row_rids(BOX_OUTPUT, dataset, columns, dtypes)


def box_output_digests_arrow(dataset: str, arrays, dtypes):
    """``box_output_digests`` of Arrow arrays (one per hashed column, Spark's Arrow types), vectorised with
    numpy where a value hashes as 4 or 8 bytes (booleans, integers, dates, timestamps, floats), value by
    value elsewhere (strings, binary, decimals); an int64 numpy array."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(arrays[0]) if arrays else 0
    h = np.full(n, spark_xxhash64(BOX_OUTPUT, dataset) & _M, dtype=np.uint64)
    for array, dtype in zip(arrays, dtypes):
        dtype = _SIMPLE_NAMES.get(dtype, dtype)
        array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
        valid = pc.is_valid(array).to_numpy(zero_copy_only=False)
        if dtype in _INTS or dtype in ("boolean", "date"):
            values = pc.fill_null(array.cast(pa.int32()), 0).to_numpy(zero_copy_only=False).view(np.uint32)
            hashed = _xxh64_ints(values, h)
        elif dtype in _LONGS:
            values = pc.fill_null(array.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).view(np.uint64)
            hashed = _xxh64_longs(values, h)
        elif dtype == "double":
            values = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False).astype(np.float64)
            bits = np.where(values == 0.0, 0.0, values).view(np.uint64)
            hashed = _xxh64_longs(np.where(np.isnan(values), np.uint64(0x7FF8000000000000), bits), h)
        elif dtype == "float":
            values = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False).astype(np.float32)
            bits = np.where(values == 0.0, np.float32(0.0), values).view(np.uint32)
            hashed = _xxh64_ints(np.where(np.isnan(values), np.uint32(0x7FC00000), bits), h)
        else:
            hasher = _hasher(dtype)
            hashed = h.copy()
            for i, value in enumerate(array.to_pylist()):
                if value is not None:
                    hashed[i] = xxh64(hasher(value), int(h[i]))
        h = np.where(valid, hashed, h)
    return h.view(np.int64)


def _xxh64_ints(values, seeds):
    """XXH64 of each 4-byte little-endian value with its seed (numpy uint32 values, uint64 seeds)."""
    import numpy as np

    u = np.uint64
    with np.errstate(over="ignore"):
        h = seeds + u(_P5) + u(4)
        h = h ^ (values.astype(np.uint64) * u(_P1))
        return _avalanche(_rotl_numpy(h, 23) * u(_P2) + u(_P3))


def box_output_rids(digests, query: str, op: int, batch: int):
    """The rid of each of a batch's black box output rows, from their digests (a numpy int64 array)."""
    return state_node_rids(digests, state_rid(query, op, batch))
