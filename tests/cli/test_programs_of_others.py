"""Programs of others: published Structured Streaming programs, traced as their authors wrote them.

Eight programs (``tests/programs_of_others.py``, each with its origin and what was changed above
it) from Spark's own Python examples and its Structured Streaming Programming Guide, changed only
at their source (Spark's Kafka connector, keeping their own column handling) and at their
sink (a checkpointed Parquet sink in their own output mode, traced; ``foreachBatch`` appending
each batch to Parquet, untraced). Every round of a program's events is produced first, then read
by one live query traced and one untraced, all programs at once, a round a micro-batch
(``maxOffsetsPerTrigger``, the data already there: both queries see the same batches), each stopped once it has
read everything and run the no-data batch its watermark asks for. The applyInPandasWithState
session program, whose sessions close on a processing-time timeout, is fed round after round
instead, each round once the last one's sessions timed out. Then, per program:

- the traced sink holds exactly the untraced program's rows (``_hw_rid`` aside);
- the backward lineage of every output row is exactly the Kafka records (and static-table rows) a
  brute-force oracle in plain Python derives it from, flagged exact, except through the stateful
  black box, where it is capture's documented superset, flagged ``exact=false``: every record the
  black box read up to the batch that emitted the row (capture/README.md, "Operators");
- the forward lineage of every produced record is exactly the output rows whose oracle holds it,
  and a record in none was read by a fully captured batch of the query.

Record timestamps matter to two programs (the windowed word count and the session program use the
Kafka record's own timestamp): records are produced with explicit timestamps, which the oracle uses.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pytest
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics, producer
from headwater.adapters.spark_lines import last_progress, recent_progress
from headwater.capture import attach
from headwater.core.offsets import partition_offsets, reached
from headwater.core.rid import kafka_rid
from headwater.core.schema import LOG_BATCH
from headwater.query.api import LineageClient
from tests import programs_of_others as programs
from tests.conftest import index, local_file, own_topics, read_log, records_read, stop_when_idle, while_initializing
from tests.oracle import as_input

S, MIN, H = 1000, 60_000, 3_600_000
T0_MS = int(dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
ROUNDS = 3


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


def epoch_ms(value) -> int | None:
    """A timestamp Spark handed back (a naive datetime in local time, as PySpark converts them) in epoch ms."""
    return None if value is None else round(value.timestamp() * 1000)


@dataclass
class Record:
    """One produced Kafka record: its topic (by the program's name for it), value, timestamp
    (None: the producer's clock), round, parsed event, whether it is late by design, and where it landed."""
    topic: str
    value: str
    ts_ms: int | None = None
    round: int = 0
    event: dict | None = None
    late: bool = False
    coord: tuple = ()

    @staticmethod
    def json(topic: str, event: dict, round: int, late: bool = False) -> "Record":
        return Record(topic, json.dumps(event), None, round, event, late)


# ----------------------------------------------------------------------------------------------
# The events each program reads, per round.

WORD_LINES = [
    ["spark kafka", "kafka stream kafka", "lineage"],
    ["spark spark", "row kafka", "stream lineage spark"],
    ["row", "kafka lineage", "spark row stream"],
]


def kafka_wordcount_rounds() -> list[list[Record]]:
    return [[Record("lines", line, T0_MS + (r * 20 + i) * S, r) for i, line in enumerate(lines)]
            for r, lines in enumerate(WORD_LINES)]


def windowed_rounds() -> list[list[Record]]:
    # Lines 4 s apart, rounds 14 s apart: each line falls in two 10-s windows sliding by 5 s, and a
    # window gets lines of two rounds.
    return [[Record("lines", line, T0_MS + (r * 14 + i * 4) * S + 250, r)
             for i, line in enumerate(lines + ["row spark"])]
            for r, lines in enumerate(WORD_LINES)]


def guide_session_rounds() -> list[list[Record]]:
    """Users' events, rounds 22 minutes apart (event time): u0 has two sessions a round, u1's last event of a
    round and first of the next are 3 minutes apart (one session over two batches), u2 one event a round;
    after the last round two events far behind the watermark (10 minutes), late."""
    out = []
    for r in range(ROUNDS):
        base = T0_MS + r * 22 * MIN
        events = [("u0", 0), ("u0", 3), ("u0", 12), ("u1", 1 if r else 2), ("u1", 20), ("u2", 6 + 3 * (r % 2))]
        records = [Record.json("events", {"timestamp": iso(base + m * MIN + 7 * S), "userId": u}, r) for u, m in events]
        if r == ROUNDS - 1:
            records += [Record.json("events", {"timestamp": iso(T0_MS + m * MIN), "userId": u}, r, late=True)
                        for u, m in (("u2", 1), ("u0", 4))]
        out.append(records)
    return out


def join_rounds() -> list[list[Record]]:
    """Impressions and clicks, rounds 4 hours apart (event time): ads r*10+i shown 10 minutes apart; clicks on
    even ads within the hour, one on ad 5 after it (no match); from round 1 a click on ad 1 of the round
    before (matched across batches), in round 0 one on ad 3 before it was shown (no match); after the last
    round an impression and a click far behind the watermarks."""
    out = []
    for r in range(ROUNDS):
        base = T0_MS + r * 4 * H
        records = []
        for i in range(6):
            ad, shown = r * 10 + i, base + i * 10 * MIN
            records.append(Record.json("impressions", {"impressionAdId": ad, "impressionTime": iso(shown)}, r))
            if i % 2 == 0 or i == 5:
                clicked = shown + (75 * MIN if i == 5 else i * 7 * MIN)
                records.append(Record.json("clicks", {"clickAdId": ad, "clickTime": iso(clicked)}, r))
        if r:
            before = T0_MS + (r - 1) * 4 * H
            records.append(Record.json("clicks", {"clickAdId": (r - 1) * 10 + 1, "clickTime": iso(before + 65 * MIN)},
                                       r))
        else:
            records.append(Record.json("clicks", {"clickAdId": 3, "clickTime": iso(base + 25 * MIN)}, r))
        if r == ROUNDS - 1:
            records.append(Record.json("impressions", {"impressionAdId": 900, "impressionTime": iso(T0_MS + 5 * MIN)},
                                       r, late=True))
            records.append(Record.json("clicks", {"clickAdId": 900, "clickTime": iso(T0_MS + 6 * MIN)}, r, late=True))
        out.append(records)
    return out


def dedup_rounds() -> list[list[Record]]:
    """guid/eventTime events, rounds 30 s apart: a guid sent again with the same time (a duplicate) and with
    another time (a new key) in its round, one of the round before sent again (a duplicate across
    batches, within the 10-s watermark; in round 0 another duplicate), and after the last round a new
    guid far behind the watermark."""
    out = []
    for r in range(ROUNDS):
        base = T0_MS + r * 30 * S

        def event(guid, t, attempt, late=False):
            return Record.json("events", {"guid": guid, "eventTime": iso(t), "attempt": attempt}, r, late)

        records = [event(f"g{r}-{i}", base + i * 2 * S, 1) for i in range(5)]
        records += [event(f"g{r}-0", base, 2), event(f"g{r}-1", base + 2 * S + 500, 1)]
        records.append(event(f"g{r - 1}-4", base - 30 * S + 8 * S, 3) if r else event("g0-3", base + 6 * S, 2))
        if r == ROUNDS - 1:
            records.append(event(f"late-{r}", T0_MS + S, 1, late=True))
        out.append(records)
    return out


def dedup_within_rounds() -> list[list[Record]]:
    """guid events, rounds 11 hours apart: a guid sent again 5 minutes later in its round, one of the round
    before sent again 20 minutes after its first time (within the 10-hour watermark, a batch later; in round
    0 another sent again 7 minutes later), and after the last round a new guid far behind the watermark."""
    out = []
    for r in range(ROUNDS):
        base = T0_MS + r * 11 * H

        def event(guid, t, attempt, late=False):
            return Record.json("events", {"guid": guid, "eventTime": iso(t), "attempt": attempt}, r, late)

        records = [event(f"g{r}-{i}", base + i * 10 * MIN, 1) for i in range(4)]
        records.append(event(f"g{r}-0", base + 5 * MIN, 2))
        records.append(event(f"g{r - 1}-2", base - 11 * H + 40 * MIN, 3) if r else event("g0-1", base + 17 * MIN, 2))
        if r == ROUNDS - 1:
            records.append(event(f"late-{r}", T0_MS + 5 * MIN, 1, late=True))
        out.append(records)
    return out


TYPES = {"a": "type-a", "b": "type-b", "c": "type-c"}  # the static table; types d and e have no row


def static_join_rounds() -> list[list[Record]]:
    return [[Record.json("events", {"id": r * 10 + i, "type": "abcde"[(r * 2 + i) % 5], "amount": r * 7 + i}, r)
             for i in range(5)] for r in range(ROUNDS)]


# The applyInPandasWithState session program: rounds of waves (a wave is read before the next is
# produced), a round produced once the last one's sessions timed out. One wave a round: a session
# continued by a second wave would time out in between whenever a traced batch of this black box takes
# 3-5 s on two busy cores (the first takes 20-25 s), so what the function computes would hang on timing.
SESSION_WAVES = [
    [["alpha beta", "beta", "alpha gamma"]],
    [["beta delta", "delta delta alpha"]],
]


def session_waves() -> list[list[list[Record]]]:
    return [[[Record("lines", line, T0_MS + (r * 100 + w * 3 + i) * S + 500, r) for i, line in enumerate(lines)]
             for w, lines in enumerate(waves)] for r, waves in enumerate(SESSION_WAVES)]


# ----------------------------------------------------------------------------------------------
# The oracles: from the produced records, which batch of the traced query read each, and the traced
# output rows with their batches, the inputs each output row derives from (asserting on the way that
# the rows are the ones the program computes).


@dataclass
class Run:
    program: "Program"
    name: str  # the traced query's name
    topics: dict  # the program's name for a topic -> the topic
    records: list = field(default_factory=list)
    read: dict = field(default_factory=dict)  # coordinates -> the traced query's batch that read it
    watermarks: dict = field(default_factory=dict)  # the traced query's batch -> the watermark it ran with (ms)
    traced: list = field(default_factory=list)  # (row, batch)
    untraced: list = field(default_factory=list)  # rows


def read_by(run: Run, batch: int) -> list[Record]:
    return [r for r in run.records if run.read.get(r.coord, batch + 1) <= batch]


def event_ms(record: Record, column: str) -> int:
    return int(dt.datetime.fromisoformat(record.event[column]).timestamp() * 1000)


def late_as_designed(run: Run, time_of: Callable[[Record], int], slack_ms: int = 0) -> None:
    """The records the rounds make late are behind the watermark of the batch that read them (by more than
    ``slack_ms``), and no other record is: which records Spark drops as late is then known, not guessed."""
    for record in run.records:
        watermark = run.watermarks.get(run.read[record.coord], 0)
        if record.late:
            assert time_of(record) + slack_ms < watermark, (record, run.watermarks)
        else:
            assert time_of(record) >= watermark, (record, run.watermarks)


def oracle_kafka_wordcount(run: Run) -> list[set]:
    """Complete mode: every batch emits every word read so far, with its count; a word's row derives from
    every record read so far that holds the word."""
    expected = {}
    for batch in {b for _, b in run.traced}:
        counts, sources = Counter(), {}
        for record in read_by(run, batch):
            for word in record.value.split(" "):
                counts[word] += 1
                sources.setdefault(word, set()).add(record.coord)
        expected.update({(batch, word, n): sources[word] for word, n in counts.items()})
    keys = [(b, row["word"], row["count"]) for row, b in run.traced]
    assert set(run.read.values()) <= {b for _, b in run.traced}, "a batch that read lines emitted nothing"
    assert Counter(keys) == Counter(expected.keys())
    return [expected[k] for k in keys]


def sliding_windows(ts_ms: int, size_ms: int = 10 * S, slide_ms: int = 5 * S) -> list[tuple[int, int]]:
    last = ts_ms - ts_ms % slide_ms
    return [(start, start + size_ms) for start in range(last - size_ms + slide_ms, last + 1, slide_ms)
            if start <= ts_ms < start + size_ms]


def oracle_windowed(run: Run) -> list[set]:
    """Complete mode, 10-s windows sliding by 5 s over the records' timestamps: every batch emits every
    (window, word) read so far; its row derives from the records read so far in the window holding the word."""
    expected = {}
    for batch in {b for _, b in run.traced}:
        counts, sources = Counter(), {}
        for record in read_by(run, batch):
            for window in sliding_windows(record.ts_ms):
                for word in record.value.split(" "):
                    counts[window, word] += 1
                    sources.setdefault((window, word), set()).add(record.coord)
        expected.update({(batch, *window, word, n): sources[window, word] for (window, word), n in counts.items()})
    keys = [(b, epoch_ms(row["window"]["start"]), epoch_ms(row["window"]["end"]), row["word"], row["count"])
            for row, b in run.traced]
    assert set(run.read.values()) <= {b for _, b in run.traced}, "a batch that read lines emitted nothing"
    assert Counter(keys) == Counter(expected.keys())
    return [expected[k] for k in keys]


def guide_sessions(records: list[Record], gap_ms: int = 5 * MIN) -> dict[tuple, set]:
    """Each user's session windows over the records on time: (user, start, end, count) -> its records."""
    by_user: dict = {}
    for record in records:
        if not record.late:
            by_user.setdefault(record.event["userId"], []).append(record)
    sessions = {}
    for user, held in by_user.items():
        current = None
        for record in sorted(held, key=lambda r: r.event["timestamp"]):
            t = int(dt.datetime.fromisoformat(record.event["timestamp"]).timestamp() * 1000)
            if current is not None and t < current["end"]:
                current["end"] = max(current["end"], t + gap_ms)
                current["records"].add(record.coord)
            else:
                current = {"start": t, "end": t + gap_ms, "records": {record.coord}}
                sessions.setdefault(user, []).append(current)
    return {(user, s["start"], s["end"], len(s["records"])): s["records"]
            for user, held in sessions.items() for s in held}


def oracle_guide_session_window(run: Run) -> list[set]:
    """Append mode: a session is emitted once, whole, when the watermark (10 minutes behind the latest event
    time) passes its end; late events are dropped. Every emitted row is one of the sessions of the events on
    time, and every session ending before the last batch's watermark was emitted."""
    late_as_designed(run, lambda r: event_ms(r, "timestamp"), slack_ms=5 * MIN)
    sessions = guide_sessions(run.records)
    keys = [(row["userId"], epoch_ms(row["session_window"]["start"]), epoch_ms(row["session_window"]["end"]),
             row["count"]) for row, _ in run.traced]
    assert len(keys) == len(set(keys)), "a session was emitted twice"
    assert set(keys) <= set(sessions), f"rows that are no session of the events: {set(keys) - set(sessions)}"
    closed = {k for k in sessions if k[2] < max(run.watermarks.values())}
    assert closed <= set(keys), f"sessions closed by the watermark but not emitted: {closed - set(keys)}"
    assert any(len(sessions[k]) > 1 and len({run.read[c] for c in sessions[k]}) > 1 for k in keys), \
        "no emitted session spans two batches"
    return [sessions[k] for k in keys]


def oracle_guide_join(run: Run) -> list[set]:
    """Left outer join of impressions with the clicks on their ad within the hour after: a joined row derives
    from its impression and its click; an impression emitted alone (no click, once the watermark passed)
    from its impression. Every pair on time is emitted; no impression that has one is emitted alone."""
    late_as_designed(run, lambda r: event_ms(r, "impressionTime" if r.topic == "impressions" else "clickTime"))
    impressions = [r for r in run.records if r.topic == "impressions"]
    clicks = [r for r in run.records if r.topic == "clicks"]
    pairs = {}
    for i in impressions:
        for c in clicks:
            shown, clicked = event_ms(i, "impressionTime"), event_ms(c, "clickTime")
            if i.event["impressionAdId"] == c.event["clickAdId"] and shown <= clicked <= shown + H:
                pairs[(i.event["impressionAdId"], shown, c.event["clickAdId"], clicked)] = ({i.coord, c.coord},
                                                                                            i.late or c.late)
    on_time = {k for k, (_, late) in pairs.items() if not late}
    matched = {(k[0], k[1]) for k in on_time}
    allowed = {k: inputs for k, (inputs, _) in pairs.items()}
    allowed.update({(i.event["impressionAdId"], event_ms(i, "impressionTime"), None, None): {i.coord}
                    for i in impressions if (i.event["impressionAdId"], event_ms(i, "impressionTime")) not in matched})
    keys = [(row["impressionAdId"], epoch_ms(row["impressionTime"]), row["clickAdId"], epoch_ms(row["clickTime"]))
            for row, _ in run.traced]
    assert len(keys) == len(set(keys)), "a row was emitted twice"
    assert set(keys) <= set(allowed), f"rows the join does not make: {set(keys) - set(allowed)}"
    assert on_time <= set(keys), f"pairs on time not emitted: {on_time - set(keys)}"
    # An impression without a click, an hour (the condition's range) and a minute behind the last watermark,
    # was taken out of the join's state, and emitted alone.
    late = {(i.event["impressionAdId"], event_ms(i, "impressionTime")) for i in impressions if i.late}
    alone = {k for k in allowed if k[2] is None and k[:2] not in late and k[1] + H + MIN < max(run.watermarks.values())}
    assert alone and alone <= set(keys), f"impressions without clicks not emitted alone: {alone - set(keys)}"
    assert any(len({run.read[c] for c in allowed[k]}) > 1 for k in keys), "no pair joined across batches"
    return [allowed[k] for k in keys]


def first_of_each(run: Run, key: Callable[[dict], tuple]) -> dict[tuple, set]:
    """The first record on time of each deduplication key (in offset order: one partition), by its row's content."""
    kept = {}
    for record in sorted((r for r in run.records if not r.late), key=lambda r: r.coord[3]):
        kept.setdefault(key(record.event), record)
    return {(r.event["guid"], event_ms(r, "eventTime"), r.event["attempt"]): {r.coord} for r in kept.values()}


def oracle_dedup(key: Callable[[dict], tuple]):
    def oracle(run: Run) -> list[set]:
        """A kept row derives from the record it is: the first on time of its key; duplicates and late records
        are in no row."""
        late_as_designed(run, lambda r: event_ms(r, "eventTime"))
        expected = first_of_each(run, key)
        keys = [(row["guid"], epoch_ms(row["eventTime"]), row["attempt"]) for row, _ in run.traced]
        assert Counter(keys) == Counter(expected.keys())
        return [expected[k] for k in keys]
    return oracle


def oracle_static_join(run: Run) -> list[set]:
    """Left outer join with the static types: every event's row derives from its record and, where its type
    has a row, that row (by its declared key, the type)."""
    by_id = {r.event["id"]: r for r in run.records}
    assert Counter(row["id"] for row, _ in run.traced) == Counter(by_id.keys())
    out = []
    for row, _ in run.traced:
        record = by_id[row["id"]]
        assert (row["type"], row["amount"], row["label"]) == (record.event["type"], record.event["amount"],
                                                              TYPES.get(record.event["type"]))
        out.append({record.coord} | ({("table", "types", row["type"])} if row["type"] in TYPES else set()))
    return out


def oracle_stateful_black_box(run: Run) -> list[set]:
    """applyInPandasWithState, a stateful black box: a session row emitted in batch b derives, as captured,
    from every record the black box read up to b (capture's superset). What the function computes: one row
    per word and round, its count of the word in the round's lines and its first and last record's second."""
    expected = Counter()
    for r in range(len(SESSION_WAVES)):
        held = [rec for rec in run.records if rec.round == r]
        for word in {w for rec in held for w in rec.value.split(" ")}:
            times = [rec.ts_ms // 1000 for rec in held if word in rec.value.split(" ")]
            expected[(word, sum(rec.value.split(" ").count(word) for rec in held), min(times), max(times))] += 1
    assert Counter((row["sessionId"], row["count"], row["start"], row["end"]) for row, _ in run.traced) == expected
    return [{rec.coord for rec in read_by(run, batch)} for _, batch in run.traced]


@dataclass
class Program:
    build: Callable  # (spark, bootstrap, topics, workdir) -> (DataFrame, output mode)
    topics: tuple
    rounds: Callable
    oracle: Callable
    keys: dict | None = None
    live: bool = False  # fed round after round as its sessions time out (``Live``), not produced beforehand


# build: (spark, bootstrap, topics by the program's names for them, maxOffsetsPerTrigger of each, workdir).
PROGRAMS = {
    "kafka_wordcount": Program(
        lambda spark, bootstrap, t, m, _: programs.structured_kafka_wordcount(spark, bootstrap, t["lines"], m["lines"]),
        ("lines",), kafka_wordcount_rounds, oracle_kafka_wordcount),
    "wordcount_windowed": Program(
        lambda spark, bootstrap, t, m, _: programs.structured_network_wordcount_windowed(spark, bootstrap, t["lines"],
                                                                                         m["lines"]),
        ("lines",), windowed_rounds, oracle_windowed),
    "session_window": Program(
        lambda spark, bootstrap, t, m, _: programs.guide_session_window(spark, bootstrap, t["events"], m["events"]),
        ("events",), guide_session_rounds, oracle_guide_session_window),
    "stream_stream_join": Program(
        lambda spark, bootstrap, t, m, _: programs.guide_stream_stream_join(
            spark, bootstrap, t["impressions"], t["clicks"], (m["impressions"], m["clicks"])),
        ("impressions", "clicks"), join_rounds, oracle_guide_join),
    "dedup_watermark": Program(
        lambda spark, bootstrap, t, m, _: programs.guide_dedup_with_watermark(spark, bootstrap, t["events"],
                                                                              m["events"]),
        ("events",), dedup_rounds, oracle_dedup(lambda e: (e["guid"], e["eventTime"]))),
    "dedup_within_watermark": Program(
        lambda spark, bootstrap, t, m, _: programs.guide_dedup_within_watermark(spark, bootstrap, t["events"],
                                                                                m["events"]),
        ("events",), dedup_within_rounds, oracle_dedup(lambda e: (e["guid"],))),
    "stream_static_join": Program(
        lambda spark, bootstrap, t, m, workdir: programs.guide_stream_static_join(
            spark, bootstrap, t["events"], str(workdir / "types.parquet"), m["events"]),
        ("events",), static_join_rounds, oracle_static_join, keys={"types": "type"}),
    "session_state_black_box": Program(
        lambda spark, bootstrap, t, m, _: programs.structured_network_wordcount_session_window(spark, bootstrap,
                                                                                               t["lines"]),
        ("lines",), session_waves, oracle_stateful_black_box, live=True),
}
BLACK_BOXES = {"session_state_black_box"}


# ----------------------------------------------------------------------------------------------
# Running them.


def produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    """``records`` into ``topic`` in order, each with its own timestamp; each one's coordinates into it."""
    client = producer(bootstrap)
    try:
        futures = [client.send(topic, value=r.value.encode(), timestamp_ms=r.ts_ms) for r in records]
        client.flush(timeout=60)
        for record, future in zip(records, futures):
            meta = future.get(timeout=10)
            record.coord = ("kafka", topic, meta.partition, meta.offset)
    finally:
        client.close()


def produce_round(config, run: Run, records: list[Record]) -> dict[tuple[str, int], int]:
    """A round's records into their topics; the end offsets (``{(topic, 0): next}``) every topic of the run
    has then."""
    for name, topic in run.topics.items():
        produce(config.bootstrap, topic, [r for r in records if r.topic == name])
    run.records.extend(records)
    ends = {(topic, 0): 0 for topic in run.topics.values()}
    for record in run.records:
        key = (record.coord[1], record.coord[2])
        ends[key] = max(ends[key], record.coord[3] + 1)
    return ends


def sink_of(workdir, run: Run, traced: bool) -> str:
    return str(workdir / f"sink-{run.name}{'' if traced else '-untraced'}")


def start(spark, config, workdir, run: Run, tracer, trigger: str):
    """One query of ``run``'s program, traced by ``tracer`` (as ``run.name``) or not (None), into its sink
    from its checkpoint beside it, with a processing-time ``trigger``."""
    # One micro-batch per round: each source reads at most a round's records of its topic a batch (a
    # program's rounds are of one size; the last one's late records come in a batch after it).
    per_round = {} if run.program.live else \
        {name: sum(r.topic == name for r in run.program.rounds()[0]) for name in run.topics}
    df, mode = run.program.build(spark, config.bootstrap, run.topics, per_round, workdir)
    sink = sink_of(workdir, run, tracer is not None)
    if tracer is not None:
        writer = tracer.trace(df, name=run.name, keys=run.program.keys).writeStream.format("parquet") \
            .option("path", sink)
    else:
        writer = df.writeStream.foreachBatch(
            lambda batch, batch_id: batch.withColumn("_batch", F.lit(batch_id)).write.mode("append").parquet(sink))
    return writer.outputMode(mode).option("checkpointLocation", f"{sink}-checkpoint") \
        .trigger(processingTime=trigger).start()


def kafka_records_read(query) -> dict[tuple, int]:
    """The batch of ``query`` that read each Kafka record, by its coordinates as ``Record.coord`` and
    ``as_input`` name it."""
    return {("kafka", *read): batch for read, batch in records_read(query).items()}


def watermarks(query) -> dict[int, int]:
    """The watermark (epoch ms) each batch of ``query`` ran with, from its progress."""
    out = {}
    for progress in recent_progress(query):
        mark = (progress.eventTime or {}).get("watermark")
        if mark:
            out[progress.batchId] = int(dt.datetime.fromisoformat(mark.replace("Z", "+00:00")).timestamp() * 1000)
    return out


PROGRAM_TRIGGER = "1 second"


class Settling:
    """A live query reading records produced before it started: settled once it has read up to ``ends`` and
    no batch follows, that is once its last batch read nothing (the no-data batch Spark runs when the
    watermark moved and state waits on it), or no batch came within 3 s of the last (Spark runs that
    no-data batch at the next trigger, 1 s later)."""

    def __init__(self, query, ends: dict):
        self.query, self.ends, self.last, self.since = query, ends, None, 0.0

    def settled(self) -> bool:
        progress = last_progress(self.query)
        read = {}
        for source in (progress.sources if progress is not None else []):
            read.update(partition_offsets(source.endOffset))
        if not reached(read, self.ends):
            return False
        if self.last != (progress.batchId, progress.timestamp):
            self.last, self.since = (progress.batchId, progress.timestamp), time.monotonic()
        if self.query.status["isTriggerActive"]:
            return False
        return not progress.numInputRows or time.monotonic() - self.since > 3


class Live:
    """The applyInPandasWithState program, traced and untraced, fed round after round: each wave of a round
    once both queries read the one before, the next round once both queries' state is empty (every
    session timed out and was emitted). ``step()`` moves it on without waiting."""

    def __init__(self, spark, config, workdir, run: Run, tracer):
        self.config, self.run = config, run
        self.queries = {}
        for traced in (True, False):
            self.queries[traced] = start(spark, config, workdir, run, tracer if traced else None,
                                         programs.SESSION_WINDOW_TRIGGER)
        self.waves = [(r, w, wave) for r, waves in enumerate(run.program.rounds()) for w, wave in enumerate(waves)]
        self.rounds = len(SESSION_WAVES)
        self.phase, self.ends, self.at = "produce", None, 0
        self.deadline = time.monotonic() + 240

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def step(self) -> None:
        for query in self.queries.values():
            assert query.exception() is None, query.exception()
        if self.done:
            return
        assert time.monotonic() < self.deadline, f"the live program is stuck at {self.phase}, wave {self.at}"
        if self.phase == "produce":
            self.ends = produce_round(self.config, self.run, self.waves[self.at][2])
            self.phase = "read"
        elif self.phase == "read" and all(self._read(q) for q in self.queries.values()):
            last_of_round = self.at + 1 == len(self.waves) or self.waves[self.at + 1][0] != self.waves[self.at][0]
            self.at += 1
            self.phase = "timed out" if last_of_round else "produce"
        elif self.phase == "timed out" and all(self._emptied(q) for q in self.queries.values()):
            self.phase = "done" if self.at == len(self.waves) else "produce"

    def _read(self, query) -> bool:
        progress = last_progress(query)
        if progress is None:
            return False
        read = {}
        for source in progress.sources:
            read.update(partition_offsets(source.endOffset))
        return reached(read, self.ends)

    def _emptied(self, query) -> bool:
        progress = last_progress(query)
        return self._read(query) and bool(progress.stateOperators) and \
            all(op.numRowsTotal == 0 for op in progress.stateOperators)

    def stop(self) -> None:
        assert min(p.batchId for p in recent_progress(self.queries[True])) == 0, "progress of the first batches lost"
        self.run.read.update(kafka_records_read(self.queries[True]))
        self.run.watermarks.update(watermarks(self.queries[True]))
        for query in self.queries.values():
            stop_when_idle(query)


@pytest.fixture(scope="module")
def ran(spark, stack_config, tmp_path_factory):
    """Every program traced and untraced through all rounds, then indexed once. ``(config, {name: Run})``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    config, tag = own_topics(stack_config, "poo")
    # Capture's superset through the black box as it is, not narrowed by re-running the function
    # (whose processing-time timeouts are not replayed anyway: query/README.md).
    config = config.with_overrides(narrowing_key="", narrowing_key_file="")
    workdir = tmp_path_factory.mktemp("poo")
    pq.write_table(pa.Table.from_pylist([{"type": t, "label": label} for t, label in TYPES.items()]),
                   workdir / "types.parquet")
    runs = {name: Run(program, f"poo-{name}-{tag}", {t: f"poo-{tag}-{name}-{t}" for t in program.topics})
            for name, program in PROGRAMS.items()}
    ensure_topics(config.bootstrap, [t for run in runs.values() for t in run.topics.values()], 1)
    tracer = attach(spark, config)
    everything, live = [], None
    try:
        live = Live(spark, config, workdir, runs["session_state_black_box"], tracer)
        everything += live.queries.values()
        # Every round of every other program produced first, then read by one live query of each program,
        # traced and untraced, a round a batch (maxOffsetsPerTrigger): both see the same batches, and no
        # query is started twice. (An availableNow run of this source would read everything in one batch.)
        ends, pending = {}, {}
        for run in runs.values():
            if not run.program.live:
                for records in run.program.rounds():
                    ends[run.name] = produce_round(config, run, records)
        for run in runs.values():
            if run.program.live:
                continue
            for traced in (True, False):
                while_initializing([q for q in everything if q.isActive], at_most=1)
                live.step()
                try:
                    query = start(spark, config, workdir, run, tracer if traced else None, PROGRAM_TRIGGER)
                except Exception as e:  # which program, traced or not, Spark or capture refused
                    raise AssertionError(f"{run.name} (traced: {traced}) did not start: {e}") from e
                pending.setdefault(run.name, (run, {}))[1][traced] = Settling(query, ends[run.name])
                everything.append(query)
        deadline = time.monotonic() + 300
        while pending:
            assert time.monotonic() < deadline, f"programs still reading: {sorted(pending)}"
            live.step()
            for name, (run, queries) in list(pending.items()):
                for traced, settling in queries.items():
                    failed = settling.query.exception()
                    assert failed is None, f"{name} (traced: {traced}): {failed}"
                if all([settling.settled() for settling in queries.values()]):  # each its own clock
                    run.read.update(kafka_records_read(queries[True].query))
                    run.watermarks.update(watermarks(queries[True].query))
                    for settling in queries.values():
                        stop_when_idle(settling.query)
                    del pending[name]
            time.sleep(0.2)
        while not live.done:
            live.step()
            time.sleep(0.2)
        live.stop()
    finally:
        for query in everything:
            if query.isActive:
                query.stop()
        tracer.close()
    index(config)

    logged = read_log(config)
    for run in runs.values():
        batch_of = {local_file(f): r["batch"] for r in logged if r["schema"] == LOG_BATCH and r["query"] == run.name
                    for f in r.get("sink_files") or []}
        run.traced = [(row.asDict(recursive=True), batch_of[local_file(row["_file"])])
                      for row in spark.read.parquet(sink_of(workdir, run, True))
                      .withColumn("_file", F.input_file_name()).collect()]
        run.untraced = [row.asDict(recursive=True) for row in spark.read.parquet(sink_of(workdir, run, False))
                        .withColumn("_file", F.input_file_name()).collect()]
    return config, runs


def content(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in ("_hw_rid", "_batch", "_file")}, sort_keys=True,
                      default=str)


NAMES = sorted(PROGRAMS)


@pytest.mark.parametrize("name", NAMES)
def test_the_traced_program_writes_what_it_writes_untraced(ran, name):
    _, runs = ran
    run = runs[name]
    assert run.traced, "the program emitted nothing"
    assert Counter(content(row) for row, _ in run.traced) == Counter(content(row) for row in run.untraced)
    if name == "wordcount_windowed":
        # `.orderBy("window")` in complete mode: each batch's rows are written in window order, traced as untraced.
        for rows in ([r for r, _ in run.traced], run.untraced):
            files: dict = {}
            for row in rows:
                files.setdefault(row["_file"], []).append(row["window"]["start"])
            assert all(starts == sorted(starts) for starts in files.values())


@pytest.mark.parametrize("name", NAMES)
def test_backward_lineage_of_every_output_row_is_the_oracle(ran, name):
    config, runs = ran
    run = runs[name]
    expected = run.program.oracle(run)
    with LineageClient(config) as client:
        for (row, batch), inputs in zip(run.traced, expected):
            found = client.backward(row["_hw_rid"])
            assert {as_input(x) for x in found} == inputs, (row, batch)
            if name in BLACK_BOXES:
                assert found and not any(x.exact for x in found), "superset lineage must be flagged exact=false"
            else:
                assert all(x.exact for x in found), [x for x in found if not x.exact]


@pytest.mark.parametrize("name", NAMES)
def test_forward_lineage_of_every_record_is_the_oracle(ran, name):
    config, runs = ran
    run = runs[name]
    outputs_of: dict = {}
    for (row, _), inputs in zip(run.traced, run.program.oracle(run)):
        for item in inputs:
            outputs_of.setdefault(item, set()).add(row["_hw_rid"])
    with LineageClient(config) as client:
        for record in run.records:
            _, topic, partition, offset = record.coord
            answer = client.forward(kafka_rid(topic, partition, offset))
            assert {x.rid for x in answer} == outputs_of.get(record.coord, set()), record
            if name not in BLACK_BOXES:
                assert all(x.exact for x in answer)
            if record.coord not in outputs_of:  # dropped (late, duplicate, unmatched) or in no row emitted yet
                assert answer.complete and [(g.query, g.status) for g in answer.read_by] == [(run.name, "full")], \
                    record
        # A static table's row reaches the rows of its type.
        for table_row in (item for item in outputs_of if item[0] == "table"):
            answer = client.forward(f"table:{table_row[1]}:{table_row[2]}")
            assert {x.rid for x in answer} == outputs_of[table_row], table_row
