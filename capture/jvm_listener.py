"""Job time of traced queries' micro-batches, split into the user's and capture's.

A ``SparkListener`` in the JVM (``java/headwater/capture/JobTimes.java``, in capture's jar) sums the
time of every job Spark tags with a streaming query's id (a local property the stream's thread sets),
as capture's when the per-batch hook tagged it with ``CAPTURE_PROPERTY`` (its own publishing jobs),
else as the user's. The tracer's thread reads the sums (``JobTimes.seconds``) into
``headwater_capture_job_seconds``. In the JVM because a listener in Python was called through py4j's
callback server for every Spark event, each task's start and end among them, on the driver's cores.
"""

from __future__ import annotations

CAPTURE_PROPERTY = "headwater.capture"  # as JobTimes.CAPTURE
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark's stream execution; as JobTimes.QUERY_ID


class JobTimes:
    """The JVM listener ``listener`` (a ``headwater.capture.JobTimes``) on ``spark``'s listener bus
    until ``close()``; ``seconds()`` gives the job time it summed since the last call."""

    def __init__(self, spark, listener):
        self._context = spark.sparkContext._jsc.sc()
        self._listener = listener
        self._read: dict[tuple[str, str], int] = {}  # milliseconds already given, by (query id, part)
        self._context.addSparkListener(listener)

    def seconds(self) -> dict[tuple[str, str], float]:
        """Seconds of jobs finished since the last call, by (Spark query id, ``user`` or ``capture``)."""
        new = {}
        for line in self._listener.totals().splitlines():
            query_id, part, millis = line.split("\t")
            key, total = (query_id, part), int(millis)
            before = self._read.get(key, 0)
            if total > before:
                new[key] = (total - before) / 1000
                self._read[key] = total
        return new

    def close(self) -> None:
        self._context.removeSparkListener(self._listener)
