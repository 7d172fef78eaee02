"""The CLI's promises (``headwater/cli.py``, ``query/where.py``), each checked as a caller sees it.

- Every error, click's usage errors among them, is one JSON line on stderr and exit status 2,
  with nothing on stdout; ``--dataset``/``--where`` are refused before any JVM could start
  (``no_jvm``: importing pyspark fails the test).
- ``--where`` without Spark selects exactly the rows Spark's own evaluation of the predicate
  selects, on a Parquet sink written here (and its ORC and JSON copies), whose
  ``_spark_metadata`` log leaves out a file, as Spark does; predicates it cannot evaluate
  exactly go to Spark and still agree.
- On the demo run into the session's stack (``conftest.demo_run``): ``--where``
  over the real traced sink, ``--format table``, no Spark log lines on stderr, and the wall
  time of whole ``headwater`` processes against the bars (0.3 s a question, 1 s ``--where``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bench.cli_latency import BARS, wall_times
from headwater.cli import main as cli
from headwater.query import where as selection

# --- every error: one JSON line on stderr, exit status 2 -----------------------------------------------------------


def invoke(home: Path, *args: str):
    return CliRunner().invoke(cli, ["--home", str(home), *args], prog_name="headwater")


def error_of(result) -> dict:
    """The one JSON error line, once the result is held to the contract."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    found = json.loads(lines[0])
    assert isinstance(found["error"], str) and found["error"]
    return found


@pytest.fixture
def no_jvm(monkeypatch):
    """Importing pyspark fails: what passes with this started no Spark and no JVM."""
    for name in ("pyspark", "pyspark.sql"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("args, says, keys", [
    ([], "headwater: give a command, one of compact, demo", {"commands", "usage", "help"}),
    (["stack"], "headwater stack: give a command, one of down, status, up", {"commands"}),
    (["lineage"], "give a command, one of backward, co-contributors, co-dependents, forward", {"commands"}),
    (["lineag"], "No such command 'lineag'", {"usage", "help"}),
    (["lineage", "backward", "--rdi", "5"], "No such option '--rdi'. Did you mean '--rid'?", {"usage"}),
    (["lineage", "backward", "--rid"], "Option '--rid' requires an argument", set()),
    (["lineage", "backward", "--rid", "x"], "'x' is not a valid integer", {"option"}),
    (["lineage", "backward", "--rid", "5", "--backend", "nope"], "'nope' is not one of 'auto'", {"option"}),
    (["lineage", "backward", "--rid", "5", "--format", "xml"], "'xml' is not one of 'json', 'table'", {"option"}),
    (["lineage", "backward", "--rid", "5", "--paths", "101"], "paths is how many paths to keep per row, 0 to 100",
     {"option"}),
    (["lineage", "backward", "--rid", "5", "--cols", "zz"], "a non-zero 64-bit mask of columns", {"option"}),
    (["lineage", "backward", "--rid", "5", "--source", "kafka:t:0:1"], "not --rid and --source", set()),
    (["lineage", "backward"], "give exactly one of --rid, --source or --dataset", set()),
    (["lineage", "backward", "--dataset", "parquet:/x"], "--dataset and --where go together", set()),
    (["lineage", "forward", "--source", "kafka:no-partition"], "expected kafka:TOPIC:PARTITION:OFFSET", set()),
    (["serve", "--port", "http"], "'http' is not a valid integer", {"option"}),
    (["narrow"], "give --query, --op and at least one --batch, or --follow", set()),
    (["narrow", "--follow", "--query", "q"], "--follow narrows every black-box batch", set()),
    (["narrow", "--query", "q", "--op", "3", "--batch", "1", "--once"], "--once and --metrics-port go with --follow",
     set()),
])
def test_usage_errors_are_one_json_line_and_status_2(tmp_path, no_jvm, args, says, keys):
    found = error_of(invoke(tmp_path, *args))
    assert says in found["error"]
    assert keys <= set(found)
    if "option" in keys:
        assert found["option"] in args


def test_a_real_process_prints_nothing_else(tmp_path):
    done = subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(tmp_path), "lineage", "backward",
                           "--rdi", "5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert json.loads(done.stderr)["error"].startswith("No such option '--rdi'")
    assert done.stderr.count("\n") == 1


def test_an_unreadable_home_is_an_error(tmp_path, no_jvm):
    (tmp_path / "stack.json").write_text("{not json")
    found = error_of(invoke(tmp_path, "lineage", "backward", "--rid", "5"))
    assert found["error"].startswith("cannot read headwater's config") and found["home"] == str(tmp_path)
    (tmp_path / "stack.json").unlink()
    (tmp_path / "stack.json").mkdir()  # not a file: unreadable, even for root
    assert "IsADirectoryError" in error_of(invoke(tmp_path, "lineage", "backward", "--rid", "5"))["error"]


# --- a sink written here, its rows as Spark reads them ------------------------------------------------------------

NAMES = ["alpha", "Beta", "gamma ray", " padded ", "tab\there", "new\nline", "café", "50%_off", "", None, "ALPHA",
         "a_b", "x%y", "ünï", "日本"]
SCHEMA = pa.schema([("id", pa.int64()), ("i", pa.int32()), ("t", pa.int8()), ("s", pa.int16()), ("f", pa.float32()),
                    ("d", pa.float64()), ("name", pa.string()), ("flag", pa.bool_()), ("big", pa.int64()),
                    ("dec", pa.decimal128(10, 2)), ("ts", pa.timestamp("us", tz="UTC")), ("_hw_rid", pa.int64())])


def sink_rows(count: int, names: list) -> list[dict]:
    import datetime
    import decimal

    return [{"id": k, "i": (k * 7919) % 101 - 50 if k % 11 else None, "t": k % 5 - 2, "s": k * 300 - 9000,
             "f": k / 3.0 if k % 13 else None, "d": k * 1.25 - 20 if k % 7 else None, "name": names[k % len(names)],
             "flag": k % 3 == 0 if k % 4 else None, "big": (1 << 62) + k if k % 2 else -k,
             "dec": decimal.Decimal(k) / 4,
             "ts": datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(hours=k),
             "_hw_rid": None if k == 5 else 1000 + k} for k in range(count)]


def write_sink(root: Path, rows: list[dict]) -> str:
    """Three part files, of which the sink's ``_spark_metadata`` log commits two, as a file sink whose third
    batch failed after writing leaves them: Spark reads only the two."""
    root.mkdir()
    table = pa.Table.from_pylist(rows, SCHEMA)
    third = len(rows) // 3
    parts = [table.slice(0, third), table.slice(third, third), table.slice(2 * third)]
    paths = []
    for n, part in enumerate(parts):
        paths.append(root / f"part-{n:05d}.snappy.parquet")
        pq.write_table(part, paths[-1])
    (root / "_spark_metadata").mkdir()
    (root / "_spark_metadata" / "0").write_text("v1\n" + "\n".join(json.dumps(
        {"path": p.as_uri(), "size": p.stat().st_size, "isDir": False, "modificationTime": 0,
         "blockReplication": 1, "blockSize": 1 << 25, "action": "add"}) for p in (paths[0], paths[2])))
    return f"parquet:{root}"


@pytest.fixture(scope="module")
def sink(tmp_path_factory) -> str:
    return write_sink(tmp_path_factory.mktemp("where") / "sink", sink_rows(90, NAMES))


# Each predicate, and which engine answers it: "arrow" (here) or "spark" (what the fast path leaves to Spark).
PREDICATES = [
    ("id IN (7, 9, 70)", "arrow"), ("id = 7 OR id = 70", "arrow"), ("NOT (id < 50)", "arrow"),
    ("i > 0 AND NOT flag", "arrow"), ("i IS NULL", "arrow"), ("i IS NOT NULL OR d IS NULL", "arrow"),
    ("flag", "arrow"), ("flag IS TRUE", "arrow"), ("flag IS NOT FALSE", "arrow"), ("flag = true", "arrow"),
    ("name LIKE 'a%'", "arrow"), ("name LIKE '%a'", "arrow"), ("name LIKE '_a%'", "arrow"),
    ("name NOT LIKE '%a%'", "arrow"), ("name LIKE '50!%!_off' ESCAPE '!'", "arrow"), ("name LIKE '%'", "arrow"),
    ("name LIKE 'new_line'", "arrow"), ("name LIKE 'new%line'", "arrow"), ("name LIKE '__'", "arrow"),
    ("name IN ('alpha', 'Beta', NULL)", "arrow"), ("name NOT IN ('alpha', NULL)", "arrow"),
    ("name NOT IN ('alpha', 'Beta')", "arrow"), ("length(name) > 4", "arrow"), ("length(name) = 2", "arrow"),
    ("trim(name) = 'padded'", "arrow"), ("ltrim(name) = 'padded '", "arrow"), ("rtrim(name) = ' padded'", "arrow"),
    ("trim(name) = 'tab\there'", "arrow"), ("substring(name, 2, 3) = 'lph'", "arrow"),
    ("substring(name, 0, 2) = 'al'", "arrow"), ("substring(name, -3, 2) = 'ph'", "arrow"),
    ("substring(name, -10, 8) = 'alp'", "arrow"), ("substr(name, -2) = 'ta'", "arrow"),
    ("substring(name, 2, -1) = ''", "arrow"), ("left(name, 2) = 'al'", "arrow"), ("right(name, 2) = 'ha'", "arrow"),
    ("right(name, 0) = ''", "arrow"), ("concat(name, '!') = 'alpha!'", "arrow"), ("name || 'x' = 'Betax'", "arrow"),
    ("startswith(name, 'a')", "arrow"), ("endswith(name, 'a')", "arrow"), ("contains(name, 'a')", "arrow"),
    ("'it''s' = name OR \"alpha\" = name", "arrow"), (r"name = 'tab\there'", "arrow"),
    (r"name LIKE '50\%\_off'", "arrow"), (r"name = 'caf\u00e9' OR name = '\141lpha'", "arrow"),
    ("id + 1 = 8", "arrow"), ("id * 2 > 100", "arrow"), ("id - 3 < 0", "arrow"), ("id / 2 = 3.5", "arrow"),
    ("id % 7 = 3", "arrow"), ("-id < -55", "arrow"), ("abs(i) > 40", "arrow"), ("i + t > 10", "arrow"),
    ("t * 100 > 150", "arrow"), ("s + 1 > 0", "arrow"), ("length(name) + 1 = 6", "arrow"),
    ("f > 5", "arrow"), ("f > 5.5", "arrow"), ("f = 1", "arrow"), ("f < 3.34", "arrow"), ("f IN (1, 2.5)", "arrow"),
    ("d > 1.5", "arrow"), ("d = 2.5", "arrow"), ("d / 2 > 3", "arrow"), ("id = 2.0", "arrow"),
    ("i BETWEEN -10 AND 10", "arrow"), ("i NOT BETWEEN -10 AND 10", "arrow"), ("d BETWEEN 0 AND 10.5", "arrow"),
    ("big > 4611686018427387904", "arrow"), ("big = 4611686018427387905", "arrow"), ("big + 1 > 0", "arrow"),
    ("coalesce(i, 0) = 0", "arrow"), ("nvl(d, -1) < 0", "arrow"), ("ifnull(name, 'none') = 'none'", "arrow"),
    ("if(flag, 1, 0) = 1", "arrow"), ("if(i > 0, 'pos', 'neg') = 'neg'", "arrow"),
    ("CASE WHEN i > 10 THEN 'a' WHEN i > 0 THEN 'b' ELSE 'c' END = 'b'", "arrow"),
    ("CASE t WHEN 0 THEN true WHEN 1 THEN false END", "arrow"), ("isnull(i)", "arrow"), ("isnotnull(flag)", "arrow"),
    ("i <=> NULL", "arrow"), ("NOT (i <=> t)", "arrow"), ("i > NULL OR id = 3", "arrow"),
    ("ts IS NULL OR id < 3", "arrow"),
    ("id IN (1, 2.0, 3)", "arrow"), ("cast(i as bigint) > 10", "arrow"), ("cast(id as double) / 3 > 5", "arrow"),
    ("5L = id OR 2D > id OR 3BD = id OR 1E1 = id", "arrow"), ("t IN (0, 1)", "arrow"),
    ("ID = 3 OR Name = 'alpha'", "arrow"),
    ("id = 7 AND name = 'alpha' OR flag", "arrow"), ("true", "arrow"),
    # What Spark must evaluate: non-ASCII text under lower/upper, decimals, timestamps, strings as numbers,
    # errors Spark raises (an overflow, a division by zero: ANSI mode), functions not modelled here.
    ("lower(name) = 'alpha'", "spark"), ("upper(name) = 'CAFÉ'", "spark"), ("id > 1.5", "spark"),
    ("id IN (1, 2.5)", "spark"), ("dec > 5", "spark"), ("ts > '2026-11-02'", "spark"), ("id = '7'", "spark"),
    ("round(d, 0) = 3", "spark"), ("name RLIKE '^a'", "spark"), ("name ILIKE 'A%'", "spark"),
    ("year(ts) = 2026 AND id < 4", "spark"),
]


def spark_rids(spark, dataset: str, where: str) -> list[int] | str:
    """Spark's evaluation of the predicate over the same sink (``sink.select``), or its error."""
    from headwater.query.sink import select

    try:
        return select(spark, dataset, where, 10_000)
    except Exception as exc:
        return f"error: {exc}"


def spark_selections(spark, dataset: str, predicates: list[str]) -> dict[str, list[int]]:
    """Spark's evaluation of each predicate over the sink, in one job: a column per predicate, then the rids
    of the rows each holds for, as ``sink.select`` keeps them (distinct, sorted, no NULL)."""
    from headwater.query.sink import sink_frame

    rows = sink_frame(spark, dataset).selectExpr("_hw_rid", *(f"({p}) AS p{i}" for i, p in enumerate(predicates)))
    rows = rows.collect()
    return {p: sorted({r["_hw_rid"] for r in rows if r[f"p{i}"] is True and r["_hw_rid"] is not None})
            for i, p in enumerate(predicates)}


def fast_rids(dataset: str, where: str, spark=None) -> tuple[list[int] | str, str]:
    try:
        found = selection.check(dataset, where).select(10_000, spark=spark)
    except selection.NothingSelected:
        return [], "either"
    except selection.LineageError as exc:
        return f"error: {exc}", "either"
    return found.rids, found.engine


@pytest.mark.spark
def test_where_without_spark_selects_what_spark_selects(spark, sink):
    differ, engines, selecting = [], {}, 0
    selected = spark_selections(spark, sink, [where for where, _ in PREDICATES])
    for where, engine in PREDICATES:
        expected = selected[where]
        found, used = fast_rids(sink, where, spark)
        if found != expected:
            differ.append((where, found, expected))
        engines[where] = used
        selecting += 0 < len(expected) < 60  # a predicate that tells rows apart tests something
    assert not differ
    assert {w: e for w, e in engines.items() if e not in ("either", dict(PREDICATES)[w])} == {}
    assert selecting > 0.8 * len(PREDICATES)


@pytest.mark.spark
def test_where_over_orc_json_and_ascii_text(spark, sink, tmp_path):
    """Spark's own ORC and JSON copies of the sink (what a file sink of those formats holds), and an ASCII
    sink, on which lower and upper are evaluated here."""
    copies = {}
    for fmt in ("orc", "json"):
        spark.read.parquet(sink.split(":", 1)[1]).write.format(fmt).save(str(tmp_path / fmt))
        copies[fmt] = f"{fmt}:{tmp_path / fmt}"
    ascii_sink = write_sink(tmp_path / "ascii", sink_rows(30, ["alpha", "Beta", "ALPHA", "gamma", None]))
    cases = [(copies["orc"], w) for w, e in PREDICATES[:60:3] if e == "arrow"] + \
            [(copies["json"], w) for w, e in PREDICATES[:60:3] if e == "arrow"] + \
            [(ascii_sink, w) for w in ("lower(name) = 'alpha'", "upper(name) LIKE 'AL%'", "lower(name) IN ('beta')")]
    selected = {dataset: spark_selections(spark, dataset, [w for d, w in cases if d == dataset])
                for dataset in {d for d, _ in cases}}
    for dataset, where in cases:
        expected = selected[dataset][where]
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "pyspark", None)  # answered without Spark, or the test fails
            found, engine = fast_rids(dataset, where)
        assert (found, engine in ("arrow", "either")) == (expected, True), (dataset, where)
    # A JSON object is its text here but a struct to Spark: Spark answers.
    spark.createDataFrame([(1, (2, "x"), 11), (2, None, 12)], "id int, s struct<a: int, b: string>, _hw_rid long") \
        .write.json(str(tmp_path / "nested"))
    nested = f"json:{tmp_path / 'nested'}"
    assert fast_rids(nested, "s IS NULL", spark) == (spark_rids(spark, nested, "s IS NULL"), "spark") == ([12], "spark")


def test_where_without_spark_never_imports_pandas(sink):
    """pyarrow imports pandas (0.3-0.5 s) whenever it turns a Python value into an Arrow one: a CLI run of
    ``--where`` stays under its bar only if the fast path never asks it to. In a fresh process, every
    predicate the fast path answers."""
    predicates = [where for where, engine in PREDICATES if engine == "arrow"]
    code = (f"import sys\nfrom headwater.query import where as selection\n"
            f"for where in {predicates!r}:\n"
            f"    try:\n        selection.check({sink!r}, where).select(10_000)\n"
            f"    except selection.NothingSelected:\n        pass\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_where_is_refused_before_spark(tmp_path, sink, no_jvm):
    no_rid = tmp_path / "no_rid"
    no_rid.mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), no_rid / "part-0.parquet")
    cases = [
        ("console:", "a = 1", "give a sink as lineage names it", {}),
        ("table:x y", "a = 1", "a table is named table:NAME", {}),
        ("parquet:/tmp/a\x01b", "a = 1", "control character at position 14", {"position": 14}),
        ("parquet:" + "a" * 5000, "a = 1", "at most 4096", {}),
        (sink, "", "one SQL expression", {}),
        (sink, "x" * 4097, "4097 characters long", {}),
        (sink, "id = = 1", "not a SQL expression", {"position": 5}),
        (sink, "(id = 1", "Expecting )", {"position": 6}),
        (sink, "name = 'open", "Missing '", {"position": 7}),
        (sink, "id = 1; DROP TABLE x", "';' at position 6", {"position": 6}),
        (sink, "id = 1 oops", "unexpected 'oops'", {"position": 7}),
        (sink, "id = 1 OR id IN (1, 2) IS NULL", "which Spark's parser refuses", {"position": 10}),
        (sink, "name LIKE 'a%' = true", "which Spark's parser refuses", {"position": 0}),
        (sink, "reflect('java.lang.Runtime', 'getRuntime') IS NOT NULL", "may not call 'reflect'",
         {"position": 0, "function": "reflect"}),
        (sink, "id = 1 AND java_method('java.lang.System', 'exit', 0) = 1", "may not call 'java_method'",
         {"position": 11}),
        (sink, "input_file_name() = 'x'", "may not call 'input_file_name'", {}),
        (sink, "my_udf(id) = 1", "may not call 'my_udf'", {}),
        (sink, "transform(array(1), x -> x) IS NULL", "may not call", {}),
        (sink, "id IN (SELECT 1)", "Subquery is not allowed", {}),
        (sink, "EXISTS (SELECT 1)", "Exists is not allowed", {}),
        (sink, "no_such_column > 1", "no column 'no_such_column'", {"position": 0}),
        (sink, "NULL", "not a boolean expression", {}),
        (sink, "id < 0", "--where selects no row of parquet:", {"where": "id < 0"}),
        (f"parquet:{tmp_path / 'none'}", "a = 1", "no such file or folder", {}),
        (f"parquet:{no_rid}", "a = 1", "has no _hw_rid column", {}),
    ]
    for dataset, where, says, keys in cases:
        found = error_of(invoke(tmp_path, "lineage", "backward", "--dataset", dataset, "--where", where))
        assert says in found["error"], (dataset[:40], where[:40], found)
        assert {k: found.get(k) for k in keys} == keys, (where, found)
    with pytest.raises(selection.WhereError, match="more than 3 rows"):
        selection.select(sink, "id > 10", limit=3)
    with pytest.raises(selection.NeedsSpark, match="only Spark can evaluate it"):
        selection.select(sink, "round(d, 0) = 3", fallback=False)


# --- the demo, on the session's stack -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(demo_run):
    return demo_run


def headwater(demo, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(demo.command(*args), capture_output=True, text=True, timeout=300, env=demo.env())


@pytest.mark.stack
def test_where_over_the_demos_traced_sink_without_spark(demo, spark):
    from headwater.query.sink import select

    sink = f"parquet:{demo.sink}"
    rows = spark.read.parquet(demo.sink).select("order_id", "region", "_hw_rid").collect()
    region = sorted(rows, key=lambda r: r.order_id)[0].region
    where = f"region = '{region}' AND order_id < {sorted(r.order_id for r in rows)[40]}"
    expected = select(spark, sink, where)
    assert expected and expected == sorted(r._hw_rid for r in rows if r.region == region and r.order_id < sorted(
        x.order_id for x in rows)[40])
    # A JAVA_HOME that is no Java: had Spark been started, it would fail.
    done = subprocess.run(demo.command("lineage", "backward", "--dataset", sink, "--where", where),
                          capture_output=True, text=True, timeout=120, env={**demo.env(), "JAVA_HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    summaries = [json.loads(line)["summary"] for line in done.stderr.splitlines()]
    assert [s["of"] for s in summaries] == expected and all(s["complete"] for s in summaries)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {r["of"] for r in records} == set(expected)
    assert {r["dataset"].split(":")[0] for r in records} == {"kafka", "customers"}


@pytest.mark.stack
def test_spark_when_needed_writes_no_log_lines_on_stderr(demo):
    done = headwater(demo, "lineage", "backward", "--dataset", f"parquet:{demo.sink}", "--where",
                     f"round(order_id * 1.0, 0) = {demo.order_id}")
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()  # the one answer's summary, nothing of Spark's or the JVM's
    assert json.loads(line)["summary"]["of"] == demo.rid
    nothing = headwater(demo, "lineage", "backward", "--dataset", f"parquet:{demo.sink}", "--where",
                        "round(order_id * 1.0, 0) = -1")
    assert nothing.returncode == 2 and "selects no row" in json.loads(nothing.stderr)["error"]


@pytest.mark.stack
def test_format_table_shows_a_real_answer_in_words(demo):
    as_json = headwater(demo, "lineage", "backward", "--rid", str(demo.rid))
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    done = headwater(demo, "lineage", "backward", "--rid", str(demo.rid), "--format", "table", "--payload")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == f"backward lineage of rid {demo.rid} (to source)"
    header = lines[2].split()
    assert header[:6] == ["RID", "KIND", "DATASET", "ROW", "EXACT", "VIA"] and "PAYLOAD" in header
    rows = lines[3:3 + len(records)]
    for record, row in zip(records, rows):
        assert row.startswith(str(record["rid"])) and record["dataset"] in row and "exact" in row
        coordinates = f"{record['topic']}:{record['partition']}:{record['offset']}" if record["topic"] else \
            f"key {record['key']}"
        assert coordinates in row
        if record.get("columns"):
            assert ", ".join(record["columns"]) in row
    assert lines[-1] == f"{len(records)} records. Complete: every batch on the way was fully captured."
    forward = headwater(demo, "lineage", "forward", "--source", demo.source, "--format", "table")
    assert str(demo.rid) in forward.stdout and "1 record. Complete" in forward.stdout


@pytest.mark.stack
def test_to_takes_a_dataset_s_openlineage_name(demo):
    """A catalog fed by the OpenLineage events names the demo's datasets as the events do: asked with those names,
    the answers are those asked with headwater's own."""
    from headwater.core.config import load

    def answer(*args: str) -> list[dict]:
        done = headwater(demo, "lineage", *args)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    topic = demo.source.split(":")[1]
    kafka = f"kafka://{load(demo.home).bootstrap}/{topic}"
    customers = f"file:{demo.home / 'demo' / 'customers.parquet'}"
    assert answer("backward", "--rid", str(demo.rid), "--to", kafka) == \
        answer("backward", "--rid", str(demo.rid), "--to", f"kafka:{topic}") != []
    assert answer("backward", "--rid", str(demo.rid), "--to", customers) == \
        answer("backward", "--rid", str(demo.rid), "--to", "customers") != []
    assert answer("forward", "--source", demo.source, "--to", f"file:{demo.sink}") == \
        answer("forward", "--source", demo.source, "--to", f"parquet:{demo.sink}") != []
    unknown = headwater(demo, "lineage", "backward", "--rid", str(demo.rid), "--to", "kafka://elsewhere:9092/x")
    assert unknown.returncode == 2 and kafka in json.loads(unknown.stderr)["error"]


@pytest.mark.stack
def test_a_question_takes_under_the_bar(demo):
    said = {}
    for name, args in (("backward", ("lineage", "backward", "--rid", str(demo.rid))),
                       ("forward", ("lineage", "forward", "--source", demo.source)),
                       ("where", ("lineage", "backward", "--dataset", f"parquet:{demo.sink}", "--where",
                                  f"order_id IN ({demo.order_id}, -1)"))):
        times = wall_times(demo.command(*args), 10, demo.env())
        said[name] = (round(statistics.median(times), 3), round(max(times), 3))
    print(json.dumps({"cli_wall_s": said}))
    assert all(said[name][0] <= BARS[name] for name in said), said


@pytest.mark.stack
def test_payload_with_the_broker_away_fails_within_seconds_naming_it(demo):
    from headwater.deploy.stack import free_port

    away = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    done = subprocess.run(demo.command("lineage", "backward", "--rid", str(demo.rid), "--payload"),
                          capture_output=True, text=True, timeout=120, env={**demo.env(), "HEADWATER_BOOTSTRAP": away})
    took = time.monotonic() - started
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.splitlines()
    assert away in json.loads(line)["error"]
    assert took < 8.0, took
